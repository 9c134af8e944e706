//! A `redis-server` on a host of its own: a network namespace joined to this one by a veth
//! pair, so that `iptables` inside it can partition it for real (packets dropped both ways,
//! new connections unanswered), and flushing the rules heals it. It needs root, `ip`
//! (iproute2) and `iptables`; [`IsolatedRedis::start`] says why when this machine cannot.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use deadpool_redis::redis;

/// The port Redis listens on inside its namespace (the namespace is its own host).
const PORT: u16 = 6379;

/// A Redis in its own network namespace; the namespace, the link and the server go when it
/// is dropped.
pub struct IsolatedRedis {
    namespace: String,
    host_link: String,
    address: String,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl IsolatedRedis {
    /// Starts it, or says why this machine cannot (not root, no `ip` or `iptables`, no
    /// network namespaces).
    pub fn start() -> Result<IsolatedRedis, String> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err("network namespaces and iptables need root".into());
        }
        for (tool, version) in [("ip", "-V"), ("iptables", "--version")] {
            if !succeeds(Command::new(tool).arg(version)) {
                return Err(format!("`{tool}` is not installed"));
            }
        }
        // Names and a /30 of this process's own, so that test runs side by side differ.
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let id = (std::process::id() % 4000) * 16 + NEXT.fetch_add(1, Ordering::Relaxed) % 16;
        let (third, fourth) = (id / 64 % 250, id % 64 * 4);
        let mut redis = IsolatedRedis {
            namespace: format!("fg-{id}"),
            host_link: format!("fgh{id}"),
            address: format!("10.{}.{third}.{}", 200 + id / 16000, fourth + 2),
            child: None,
            dir: tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?,
        };
        let host_address = format!("10.{}.{third}.{}/30", 200 + id / 16000, fourth + 1);
        let inner_link = format!("fgn{id}");
        let namespace = redis.namespace.clone();
        let inside = |args: &[&str]| {
            let mut command = Command::new("ip");
            command.args(["netns", "exec", &namespace]).args(args);
            command
        };
        let steps: Vec<Command> = vec![
            command("ip", &["netns", "add", &redis.namespace]),
            command(
                "ip",
                &[
                    "link",
                    "add",
                    &redis.host_link,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    &inner_link,
                ],
            ),
            command(
                "ip",
                &["link", "set", &inner_link, "netns", &redis.namespace],
            ),
            command(
                "ip",
                &["addr", "add", &host_address, "dev", &redis.host_link],
            ),
            command("ip", &["link", "set", &redis.host_link, "up"]),
            inside(&[
                "ip",
                "addr",
                "add",
                &format!("{}/30", redis.address),
                "dev",
                &inner_link,
            ]),
            inside(&["ip", "link", "set", &inner_link, "up"]),
            inside(&["ip", "link", "set", "lo", "up"]),
            inside(&["iptables", "-L", "-n"]),
        ];
        for mut step in steps {
            let output = step
                .output()
                .map_err(|e| format!("{step:?} did not run: {e}"))?;
            if !output.status.success() {
                return Err(format!(
                    "{step:?} failed: {}",
                    String::from_utf8_lossy(&output.stderr).trim()
                ));
            }
        }
        let port = PORT.to_string();
        let child = inside(&[
            "redis-server",
            "--port",
            &port,
            "--bind",
            &redis.address,
            "--protected-mode",
            "no",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .current_dir(redis.dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("redis-server in the namespace: {e}"))?;
        redis.child = Some(child);
        redis.wait_until_ready()?;
        Ok(redis)
    }

    /// `redis://…` of the server, across the link.
    pub fn url(&self) -> String {
        format!("redis://{}:{PORT}", self.address)
    }

    /// Drops every packet in and out of the namespace: established connections hear
    /// nothing, new ones get no SYN-ACK, and nothing is reset.
    pub fn cut(&self) {
        for chain in ["INPUT", "OUTPUT"] {
            self.iptables(&["-A", chain, "-j", "DROP"]);
        }
    }

    /// Drops each packet in and out of the namespace with probability `share` (0 to 1), as a
    /// lossy link does: TCP retransmits, so replies come late or, for a while, not at all.
    pub fn lose(&self, share: f64) {
        let probability = format!("{share}");
        for chain in ["INPUT", "OUTPUT"] {
            self.iptables(&[
                "-A",
                chain,
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                &probability,
                "-j",
                "DROP",
            ]);
        }
    }

    /// Removes the rules [`cut`](Self::cut) or [`lose`](Self::lose) added.
    pub fn heal(&self) {
        self.iptables(&["-F"]);
    }

    fn iptables(&self, args: &[&str]) {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.namespace, "iptables"])
            .args(args);
        assert!(succeeds(&mut command), "{command:?}");
    }

    fn wait_until_ready(&self) -> Result<(), String> {
        let client = redis::Client::open(self.url()).map_err(|e| e.to_string())?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !super::pongs(&client) {
            if Instant::now() > deadline {
                return Err(format!("redis-server on {} never answered", self.url()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

impl Drop for IsolatedRedis {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
        // The veth pair goes with either end; the namespace needs deleting.
        let _ = command("ip", &["link", "del", &self.host_link]).output();
        let _ = command("ip", &["netns", "del", &self.namespace]).output();
    }
}

fn command(program: &str, args: &[&str]) -> Command {
    let mut command = Command::new(program);
    command.args(args);
    command
}

fn succeeds(command: &mut Command) -> bool {
    command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}
