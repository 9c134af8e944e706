//! A real `redis-server` on a free loopback port, with no persistence, killed when dropped;
//! a test stops or freezes it to make floodgate answer `UNAVAILABLE`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `redis-server` (Debian's `redis-server` package).
pub struct Redis {
    child: Child,
    port: u16,
}

impl Redis {
    /// Starts a server and waits until it answers PING.
    pub fn start() -> Redis {
        let port = free_port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--logfile", ""])
            .arg("--dir")
            .arg(std::env::temp_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| {
                panic!("cannot run redis-server ({error}): apt-get install redis-server")
            });
        let mut redis = Redis { child, port };
        redis.wait_until_ready();
        redis
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Freezes the server (SIGSTOP) once it has stopped: connections stay open and commands
    /// go unanswered, so floodgate's calls time out after its script may have run.
    pub fn freeze(&self) {
        super::sigstop(self.child.id(), "redis-server");
    }

    fn wait_until_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !pongs(self.port) {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("redis-server on port {} exited: {status}", self.port);
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer PING"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Redis {
    /// SIGKILL ends a frozen server too.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port nothing listens on now: floodgate pointed there finds no Redis.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free loopback port")
        .port()
}

/// Whether a Redis on `port` answers PING.
fn pongs(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut reply = [0u8; 7];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && &reply == b"+PONG\r\n"
}
