//! Runs the real `floodgate` binary for the client's tests: the rules in `tests/rules`, gRPC
//! and HTTP on free loopback ports, killed when dropped; [`redis`] runs a real `redis-server`
//! for it to count in.

#![allow(dead_code)]

pub mod redis;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use floodgate_client::Client;

/// The domain of `tests/rules/client.yaml`.
pub const DOMAIN: &str = "client_test";

/// A running floodgate server.
pub struct Floodgate {
    child: Child,
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
}

impl Floodgate {
    /// Starts a server with extra `serve` flags and waits until it listens.
    pub fn start(flags: &[&str]) -> Floodgate {
        Self::start_with(flags, &[])
    }

    /// Starts a server counting in the Redis at `redis_url`, with `settings` as
    /// `FLOODGATE_*` environment variables (`("FLOODGATE_REDIS_COMMAND_TIMEOUT_MS", "200")`).
    pub fn on_redis(redis_url: &str, settings: &[(&str, &str)]) -> Floodgate {
        Self::start_with(&["--backend", "redis", "--redis-url", redis_url], settings)
    }

    /// Starts a server with extra `serve` flags and settings from the environment. The
    /// test's own `FLOODGATE_*` variables are left out: the server refuses the ones it does
    /// not know, such as `FLOODGATE_BIN`.
    pub fn start_with(flags: &[&str], settings: &[(&str, &str)]) -> Floodgate {
        let binary = binary();
        let rules = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/rules");
        let mut command = Command::new(&binary);
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("FLOODGATE_") {
                command.env_remove(name);
            }
        }
        let mut child = command
            .envs(settings.iter().copied())
            .args(["serve", "--rules"])
            .arg(&rules)
            .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
            .args(flags)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start {}: {error}", binary.display()));
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut first_line = String::new();
        BufReader::new(stdout)
            .read_line(&mut first_line)
            .expect("reading floodgate's stdout");
        let (Some(grpc_addr), Some(http_addr)) =
            (address(&first_line, "grpc="), address(&first_line, "http="))
        else {
            let _ = child.kill();
            panic!("floodgate did not announce its ports; first line: {first_line:?}")
        };
        Floodgate {
            child,
            grpc_addr,
            http_addr,
        }
    }

    /// How many `ShouldRateLimit` calls the server answered with `code` (`OK`,
    /// `INVALID_ARGUMENT`, …), from its `/metrics`: what reached the server, retries included.
    pub fn calls_answered(&self, code: &str) -> u64 {
        let mut stream = std::net::TcpStream::connect(self.http_addr).expect("metrics port");
        write!(stream, "GET /metrics HTTP/1.0\r\n\r\n").expect("request /metrics");
        let mut page = String::new();
        stream.read_to_string(&mut page).expect("read /metrics");
        let series = format!(
            "floodgate_requests_total{{protocol=\"grpc\",method=\"ShouldRateLimit\",code=\"{code}\"}} "
        );
        page.lines()
            .find_map(|line| line.strip_prefix(&series))
            .map_or(0, |value| value.trim().parse().expect("a count"))
    }

    /// The URL a client connects to.
    pub fn url(&self) -> String {
        format!("http://{}", self.grpc_addr)
    }

    /// A client of this server. Its timeout is generous: the 20 ms default suits production,
    /// but on a loaded test machine it would turn real answers into degraded decisions.
    pub async fn client(&self) -> Client {
        Client::connect(self.url())
            .await
            .expect("connects to floodgate")
            .timeout(Duration::from_secs(5))
    }

    /// Kills the server and waits until it is gone, so its port refuses connections.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Freezes the server (SIGSTOP) and waits until every thread has stopped: its port still
    /// accepts connections (the kernel does that), but nothing reads or answers them.
    pub fn freeze(&self) {
        sigstop(self.child.id(), "floodgate");
    }
}

/// Sends SIGSTOP to `pid` and waits until it took effect: the signal is delivered
/// asynchronously, and /proc shows state T once every thread has stopped.
pub fn sigstop(pid: u32, what: &str) {
    let status = Command::new("kill")
        .args(["-STOP", &pid.to_string()])
        .status()
        .expect("running kill");
    assert!(status.success(), "kill -STOP {pid} failed");
    let stopped = || {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .is_ok_and(|status| status.lines().any(|line| line.starts_with("State:\tT")))
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while !stopped() {
        assert!(
            Instant::now() < deadline,
            "{what} {pid} did not stop on SIGSTOP"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

impl Drop for Floodgate {
    /// SIGKILL ends a frozen process too.
    fn drop(&mut self) {
        self.stop();
    }
}

/// `$FLOODGATE_BIN`, else the workspace's debug build; a missing binary fails the test.
fn binary() -> PathBuf {
    let path = std::env::var_os("FLOODGATE_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/debug/floodgate"),
        PathBuf::from,
    );
    assert!(
        path.is_file(),
        "floodgate binary not found at {}: run `cargo build` at the workspace root or set FLOODGATE_BIN",
        path.display()
    );
    path
}

/// The address after `name` (`grpc=`, `http=`) in `floodgate listening: grpc=ADDR http=ADDR`.
fn address(line: &str, name: &str) -> Option<SocketAddr> {
    line.split_whitespace()
        .find_map(|word| word.strip_prefix(name))?
        .parse()
        .ok()
}
