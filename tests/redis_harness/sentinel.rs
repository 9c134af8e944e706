//! A real Redis Sentinel deployment for integration tests: a primary, its replica and three
//! sentinels (quorum 2) watching it, all on loopback, stopped when the handle is dropped.
//!
//! The sentinels are quick to act (a primary silent for 500 ms is down), so a failover
//! takes a few seconds. Every wait is bounded and panics with what each sentinel reported
//! and its log.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use deadpool_redis::redis::{self, FromRedisValue};

use super::{ATTEMPTS, Access, RedisServer, free_port};

/// The name the sentinels monitor the primary under.
pub const MASTER: &str = "floodgate-primary";
/// Bound on the deployment forming: the replica in sync, the sentinels knowing each other.
const FORMING: Duration = Duration::from_secs(20);
/// Bound on a failover: detection (500 ms), agreement, election, promotion.
const FAILOVER: Duration = Duration::from_secs(20);
/// Bound on a returning primary becoming a replica: the sentinels ask its role every 10 s,
/// leave one that says it is a primary alone for 8 s after it was last down, then make it a
/// replica, and it syncs.
const RETURNING: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(50);

/// A primary, a replica and three sentinels.
pub struct Sentinels {
    /// The data servers, killed ones included.
    servers: Vec<RedisServer>,
    /// The ports of the data servers killed and not started again.
    down: Vec<u16>,
    sentinels: Vec<RedisServer>,
    /// Each sentinel's configuration file (the sentinel rewrites it).
    _config: tempfile::TempDir,
}

impl Sentinels {
    /// Starts the primary and its replica, waits for the replica to sync, then starts the
    /// sentinels and waits until each knows the replica and the two other sentinels.
    pub fn start() -> Sentinels {
        Self::start_with(&[])
    }

    /// As [`start`](Self::start), the data servers started with `options` besides
    /// (`["--appendonly", "yes"]`: a killed server started again has its data back).
    pub fn start_with(options: &[&str]) -> Sentinels {
        let data = [
            &[
                "--repl-diskless-sync-delay",
                "0",
                "--replica-announce-ip",
                "127.0.0.1",
            ],
            options,
        ]
        .concat();
        let primary = RedisServer::start_with(&data);
        let port = primary.port().to_string();
        let replica_options = [&data[..], &["--replicaof", "127.0.0.1", &port]].concat();
        let replica = RedisServer::start_with(&replica_options);
        let config = tempfile::tempdir().expect("a directory for sentinel configurations");
        let sentinels = (0..3)
            .map(|i| start_sentinel(config.path().join(format!("sentinel-{i}.conf")), &port))
            .collect();
        let deployment = Sentinels {
            servers: vec![primary, replica],
            down: Vec::new(),
            sentinels,
            _config: config,
        };
        deployment.wait("the deployment to form", FORMING, Sentinels::formed);
        deployment
    }

    /// The sentinels' URLs, comma-separated: floodgate's `--redis-url`.
    pub fn urls(&self) -> String {
        let urls: Vec<String> = self.sentinels.iter().map(RedisServer::url).collect();
        urls.join(",")
    }

    /// floodgate's flags for this deployment: the sentinel backend, their URLs, the name.
    pub fn backend_flags(&self) -> Vec<String> {
        ["--backend", "redis-sentinel", "--redis-url", &self.urls()]
            .into_iter()
            .chain(["--redis-sentinel-master", MASTER])
            .map(String::from)
            .collect()
    }

    /// The data server the sentinels name as primary now (all of them agreeing).
    pub fn primary(&self) -> &RedisServer {
        let port = self
            .agreed_primary()
            .unwrap_or_else(|reason| panic!("no agreed primary: {reason}\n{}", self.report()));
        self.server_on(port)
    }

    /// The live data server that is not the primary.
    pub fn replica(&self) -> &RedisServer {
        let primary = self.primary().port();
        self.live_servers()
            .find(|server| server.port() != primary)
            .expect("a live replica")
    }

    /// SIGKILL of the primary: it vanishes without a word, as on a crash. Its port.
    pub fn kill_primary(&mut self) -> u16 {
        let port = self.primary().port();
        self.server_mut(port).kill();
        self.down.push(port);
        port
    }

    /// Starts the killed server on `port` again, on its port and with its directory (with
    /// `--appendonly yes`, its data as it was when killed): it says it is a primary until the
    /// sentinels make it a replica of the one they promoted meanwhile.
    pub fn start_again(&mut self, port: u16) {
        self.server_mut(port).start_again();
        self.down.retain(|&down| down != port);
    }

    /// Waits until the server on `port` is a replica of the current primary, in sync, and
    /// every sentinel lists it as a healthy replica (one a failover may promote).
    pub fn wait_for_replica(&self, port: u16) {
        self.wait("a replica in sync", RETURNING, |deployment| {
            let primary = deployment.agreed_primary()?;
            let replication: String = query(deployment.server_on(port), &["INFO", "replication"])?;
            let following = format!("master_port:{primary}");
            if !replication.contains("role:slave")
                || !replication.contains(&following)
                || !replication.contains("master_link_status:up")
            {
                return Err(format!(
                    "port {port} is not a replica in sync: {replication}"
                ));
            }
            for sentinel in &deployment.sentinels {
                let replicas: Vec<Vec<String>> =
                    query(sentinel, &["SENTINEL", "REPLICAS", MASTER])?;
                let healthy = replicas.iter().any(|fields| {
                    let field = |name: &str| {
                        (fields.chunks(2))
                            .find(|pair| pair[0] == name)
                            .map(|pair| pair[1].as_str())
                    };
                    field("port") == Some(&port.to_string())
                        && field("flags") == Some("slave")
                        && field("master-link-status") == Some("ok")
                });
                if !healthy {
                    return Err(format!(
                        "sentinel {} does not list port {port} as a healthy replica: \
                         {replicas:?}",
                        sentinel.port()
                    ));
                }
            }
            Ok(())
        });
    }

    /// Waits until every sentinel names a primary other than the one on `old_port`, and
    /// that server says it is a primary; returns it.
    pub fn wait_for_failover(&self, old_port: u16) -> &RedisServer {
        self.wait("a replica to be promoted", FAILOVER, |deployment| {
            let port = deployment.agreed_primary()?;
            if port == old_port {
                return Err(format!("the sentinels still name port {port}"));
            }
            let role = deployment.server_on(port).command(&["ROLE"]);
            if !role.contains("master") {
                return Err(format!("port {port} is not a primary yet: {role}"));
            }
            Ok(())
        });
        self.primary()
    }

    /// The primary becomes a replica of its replica, which becomes the primary, behind the
    /// sentinels' back (REPLICAOF, as an operator might), and the sentinels are then told
    /// to watch the new primary. Clients connected to the old primary stay connected: a
    /// sentinel failover would have killed their connections, this does not.
    pub fn swap_roles_keeping_clients(&self) -> &RedisServer {
        let old = self.primary();
        let new = self.replica();
        new.command(&["REPLICAOF", "NO", "ONE"]);
        let new_port = new.port().to_string();
        old.command(&["REPLICAOF", "127.0.0.1", &new_port]);
        for sentinel in &self.sentinels {
            sentinel.command(&["SENTINEL", "REMOVE", MASTER]);
            sentinel.command(&["SENTINEL", "MONITOR", MASTER, "127.0.0.1", &new_port, "2"]);
        }
        self.wait_for_failover(old.port())
    }

    /// The port all sentinels name as the primary's, or why there is none.
    fn agreed_primary(&self) -> Result<u16, String> {
        let mut ports = Vec::new();
        for sentinel in &self.sentinels {
            let address: Vec<String> =
                query(sentinel, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER])?;
            let port = address
                .get(1)
                .and_then(|port| port.parse().ok())
                .ok_or_else(|| format!("no address in {address:?}"))?;
            ports.push(port);
        }
        if ports.windows(2).any(|pair| pair[0] != pair[1]) {
            return Err(format!("the sentinels disagree: {ports:?}"));
        }
        Ok(ports[0])
    }

    /// Why the deployment is not formed yet, if it is not.
    fn formed(&self) -> Result<(), String> {
        let replica = &self.servers[1];
        let replication: String = query(replica, &["INFO", "replication"])?;
        if !replication.contains("master_link_status:up") {
            return Err("the replica is not in sync".into());
        }
        for sentinel in &self.sentinels {
            let replicas: Vec<redis::Value> = query(sentinel, &["SENTINEL", "REPLICAS", MASTER])?;
            let others: Vec<redis::Value> = query(sentinel, &["SENTINEL", "SENTINELS", MASTER])?;
            if replicas.len() != 1 || others.len() != 2 {
                return Err(format!(
                    "sentinel {} knows {} replicas and {} sentinels",
                    sentinel.port(),
                    replicas.len(),
                    others.len()
                ));
            }
        }
        Ok(())
    }

    /// Polls `check` until it passes; panics with its last reason after `bound`.
    fn wait(&self, what: &str, bound: Duration, check: impl Fn(&Self) -> Result<(), String>) {
        let deadline = Instant::now() + bound;
        loop {
            match check(self) {
                Ok(()) => return,
                Err(_) if Instant::now() < deadline => std::thread::sleep(POLL),
                Err(reason) => panic!(
                    "timed out after {bound:?} waiting for {what}: {reason}\n{}",
                    self.report()
                ),
            }
        }
    }

    fn live_servers(&self) -> impl Iterator<Item = &RedisServer> {
        (self.servers.iter()).filter(|server| !self.down.contains(&server.port()))
    }

    fn server_mut(&mut self, port: u16) -> &mut RedisServer {
        (self.servers.iter_mut())
            .find(|server| server.port() == port)
            .unwrap_or_else(|| panic!("no data server on port {port}"))
    }

    fn server_on(&self, port: u16) -> &RedisServer {
        self.live_servers()
            .find(|server| server.port() == port)
            .unwrap_or_else(|| panic!("no live data server on port {port}\n{}", self.report()))
    }

    /// The end of each sentinel's log: for failure messages.
    pub fn report(&self) -> String {
        let mut report = String::new();
        for sentinel in &self.sentinels {
            let _ = writeln!(report, "--- sentinel on port {}", sentinel.port());
            report.push_str(&sentinel.log_tail(15));
        }
        report
    }
}

/// One sentinel watching the primary on `primary_port`, quick to declare it down.
fn start_sentinel(config: PathBuf, primary_port: &str) -> RedisServer {
    std::fs::write(
        &config,
        format!(
            "sentinel monitor {MASTER} 127.0.0.1 {primary_port} 2\n\
             sentinel down-after-milliseconds {MASTER} 500\n\
             sentinel failover-timeout {MASTER} 2000\n\
             sentinel announce-ip 127.0.0.1\n"
        ),
    )
    .expect("writing a sentinel configuration");
    let mut failures = Vec::new();
    for _ in 0..ATTEMPTS {
        let started = RedisServer::try_start_from(
            Some(&config),
            &Access::default(),
            free_port(),
            &["--sentinel"],
        );
        match started {
            Ok(sentinel) => return sentinel,
            Err(failure) => failures.push(failure),
        }
    }
    panic!(
        "a sentinel did not start after {ATTEMPTS} attempts:\n{}",
        failures.join("\n")
    );
}

/// One command on a fresh connection, its reply typed; errors as text.
fn query<T: FromRedisValue>(server: &RedisServer, args: &[&str]) -> Result<T, String> {
    let mut connection = server
        .client()
        .get_connection_with_timeout(Duration::from_secs(2))
        .map_err(|e| format!("connect to port {}: {e}", server.port()))?;
    let (name, rest) = args.split_first().expect("a command has a name");
    redis::cmd(name)
        .arg(rest)
        .query(&mut connection)
        .map_err(|e| format!("{args:?} on port {}: {e}", server.port()))
}
