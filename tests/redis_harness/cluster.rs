//! A real Redis Cluster for integration tests: six `redis-server` processes (three primaries,
//! three replicas) joined by `redis-cli --cluster create`, stopped when the handle is dropped.
//!
//! Every wait is bounded and panics with what each node reported and its log, so a cluster
//! that cannot form on a loaded machine fails the test with a reason instead of hanging it.

use std::fmt::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use deadpool_redis::redis;

use super::{ATTEMPTS, Flavor, RedisServer, free_port};

/// The number of hash slots of every Redis Cluster.
pub const SLOTS: u16 = 16384;
/// Failure detection time: a node unreachable this long is flagged failed and its replica
/// takes over.
const NODE_TIMEOUT_MS: &str = "1000";
/// Bound on `redis-cli --cluster create` and on the cluster agreeing afterwards (a loaded
/// two-core machine runs a dozen other tests meanwhile).
const FORMING: Duration = Duration::from_secs(60);
/// Bound on one `redis-cli --cluster` change (a reshard of thousands of slots, a rebalance)
/// and on the cluster agreeing afterwards.
const CHANGING: Duration = Duration::from_secs(120);
/// Bound on a replica taking over a killed primary: detection (1 s) plus election.
const FAILOVER: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(50);

/// One node of a [`RedisCluster`], by its index in [`RedisCluster::nodes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Node(pub usize);

/// A running three-primary, three-replica cluster, stopped when dropped. Nodes can be killed,
/// restarted, added and removed; one never leaves [`RedisCluster::nodes`], so a `Node` keeps
/// naming the same server.
pub struct RedisCluster {
    servers: Vec<RedisServer>,
    /// Each node's cluster id (CLUSTER MYID), by node.
    ids: Vec<String>,
    states: Vec<State>,
}

/// Where a node of the harness stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Running and part of the cluster.
    Live,
    /// Killed: the cluster sees it failing.
    Killed,
    /// Taken out of the cluster (`del-node`) and stopped: the cluster has forgotten it.
    Removed,
}

/// How [`RedisCluster::failover`] asks a replica to take over (`CLUSTER FAILOVER`'s option).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failover {
    /// The primary stops taking writes, the replica catches up, then takes over: no write lost.
    Graceful,
    /// The replica takes over without waiting for its primary (`FORCE`), still with the other
    /// primaries' vote.
    Force,
}

/// One line of CLUSTER NODES, as one node sees another.
#[derive(Debug, Clone)]
struct NodeView {
    id: String,
    port: u16,
    flags: Vec<String>,
    /// The id of its primary, for a replica.
    primary: Option<String>,
    /// Slot ranges served, inclusive (migration markers left out).
    slots: Vec<(u16, u16)>,
}

/// A node's place in the cluster: whether it is a primary, whose replica it is, what it
/// serves.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Seat {
    port: u16,
    is_primary: bool,
    primary: Option<String>,
    slots: Vec<(u16, u16)>,
}

impl NodeView {
    fn is_primary(&self) -> bool {
        self.flags.iter().any(|flag| flag == "master")
    }

    /// Its place in the cluster, as every node should come to see it.
    fn seat(&self) -> Seat {
        Seat {
            port: self.port,
            is_primary: self.is_primary(),
            primary: self.primary.clone(),
            slots: self.slots.clone(),
        }
    }

    fn is_failing(&self) -> bool {
        self.flags
            .iter()
            .any(|flag| flag == "fail" || flag == "fail?")
    }
}

impl RedisCluster {
    /// Starts six nodes, creates the cluster (one replica per primary) and waits until every
    /// node reports `cluster_state:ok`, all 16384 slots served, every replica in sync, and
    /// all nodes agree on who serves what.
    pub fn start() -> RedisCluster {
        let servers: Vec<RedisServer> = (0..6).map(|_| start_node()).collect();
        let ids = servers
            .iter()
            .map(|server| server.command(&["CLUSTER", "MYID"]))
            .collect();
        let cluster = RedisCluster {
            states: vec![State::Live; servers.len()],
            servers,
            ids,
        };
        cluster.create();
        cluster.wait_until_ok("the new cluster to form", FORMING);
        cluster
    }

    /// `redis://…` of every node, comma-separated: floodgate's `--redis-url`.
    pub fn seeds(&self) -> String {
        self.servers
            .iter()
            .map(RedisServer::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Every node, killed ones included.
    pub fn nodes(&self) -> Vec<Node> {
        (0..self.servers.len()).map(Node).collect()
    }

    pub fn server(&self, node: Node) -> &RedisServer {
        &self.servers[node.0]
    }

    /// The node's cluster id, as CLUSTER SETSLOT and CLUSTER NODES name it.
    pub fn id(&self, node: Node) -> &str {
        &self.ids[node.0]
    }

    /// Runs one command on `node` (see [`RedisServer::command`]); panics on an error reply.
    pub fn command(&self, node: Node, args: &[&str]) -> String {
        self.server(node).command(args)
    }

    /// Runs one command on a replica after READONLY, so it answers reads of the slots it
    /// replicates instead of redirecting to its primary. `None` for a nil reply.
    pub fn replica_read(&self, replica: Node, args: &[&str]) -> Option<String> {
        let server = self.server(replica);
        let mut connection = server
            .client()
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connect to {replica:?}: {e}"));
        redis::cmd("READONLY")
            .query::<()>(&mut connection)
            .unwrap_or_else(|e| panic!("READONLY on {replica:?}: {e}"));
        let (name, rest) = args.split_first().expect("a command has a name");
        redis::cmd(name)
            .arg(rest)
            .query::<Option<String>>(&mut connection)
            .unwrap_or_else(|e| panic!("{args:?} on {replica:?}: {e}"))
    }

    /// Every key stored on `node` (KEYS *: test data sets are small).
    pub fn keys(&self, node: Node) -> Vec<String> {
        let mut connection = self
            .server(node)
            .client()
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connect to {node:?}: {e}"));
        redis::cmd("KEYS")
            .arg("*")
            .query(&mut connection)
            .unwrap_or_else(|e| panic!("KEYS on {node:?}: {e}"))
    }

    /// The hash slot of `key`, as the servers compute it (CLUSTER KEYSLOT).
    pub fn keyslot(&self, key: &str) -> u16 {
        let answer = self.command(self.live_node(), &["CLUSTER", "KEYSLOT", key]);
        answer
            .parse()
            .unwrap_or_else(|_| panic!("CLUSTER KEYSLOT {key:?} answered {answer:?}"))
    }

    /// The nodes that serve slots now, as a live node sees them.
    pub fn primaries(&self) -> Vec<Node> {
        let mut primaries: Vec<Node> = self
            .view(self.live_node())
            .iter()
            .filter(|view| view.is_primary() && !view.slots.is_empty())
            .map(|view| self.node_on(view.port))
            .collect();
        primaries.sort();
        primaries
    }

    /// The primary serving `slot`, as a live node sees it.
    pub fn primary_of(&self, slot: u16) -> Node {
        let view = self.view(self.live_node());
        let owner = view
            .iter()
            .find(|node| node.is_primary() && serves(node, slot))
            .unwrap_or_else(|| panic!("no primary serves slot {slot}: {view:?}"));
        self.node_on(owner.port)
    }

    /// The replica of `primary` (each primary has one).
    pub fn replica_of(&self, primary: Node) -> Node {
        let id = self.id(primary);
        let view = self.view(self.live_node());
        let replica = view
            .iter()
            .find(|node| node.primary.as_deref() == Some(id) && !node.is_failing())
            .unwrap_or_else(|| panic!("{primary:?} has no replica: {view:?}"));
        self.node_on(replica.port)
    }

    /// The live replicas of `primary` (replica migration can give a primary two).
    pub fn replicas_of(&self, primary: Node) -> Vec<Node> {
        let id = self.id(primary);
        (self.view(self.live_node()).iter())
            .filter(|node| node.primary.as_deref() == Some(id) && !node.is_failing())
            .map(|node| self.node_on(node.port))
            .collect()
    }

    /// SIGKILL: the node vanishes without a word, as on a crash or a lost machine.
    pub fn kill(&mut self, node: Node) {
        self.servers[node.0].kill();
        self.states[node.0] = State::Killed;
    }

    /// Starts moving `slot` from the primary `source` to the primary `target`: `target`
    /// imports it, `source` migrates it. From now on `source` answers ASK for the slot's keys
    /// it no longer holds, and `target` serves them to clients that say ASKING.
    pub fn open_slot(&self, slot: u16, source: Node, target: Node) {
        let slot = slot.to_string();
        let importing = ["CLUSTER", "SETSLOT", &slot, "IMPORTING", self.id(source)];
        self.command(target, &importing);
        let migrating = ["CLUSTER", "SETSLOT", &slot, "MIGRATING", self.id(target)];
        self.command(source, &migrating);
    }

    /// Moves one key of an open slot from `source` to `target` (MIGRATE: atomic per key).
    pub fn migrate_key(&self, key: &str, source: Node, target: Node) {
        let port = self.server(target).port().to_string();
        let migrate = ["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS", key];
        let reply = self.command(source, &migrate);
        assert_eq!(reply, "OK", "MIGRATE {key} from {source:?} to {target:?}");
    }

    /// Ends the move of `slot`: `target` owns it. Told to the new owner first, then the old
    /// one, then the other primaries (replicas refuse SETSLOT; they follow their primaries).
    pub fn close_slot(&self, slot: u16, source: Node, target: Node) {
        let slot = slot.to_string();
        let others = self
            .primaries()
            .into_iter()
            .filter(|&primary| primary != source && primary != target);
        for node in [target, source].into_iter().chain(others) {
            self.command(
                node,
                &["CLUSTER", "SETSLOT", &slot, "NODE", self.id(target)],
            );
        }
    }

    /// `127.0.0.1:<port>` of `node`, as `redis-cli --cluster` takes it.
    pub fn address(&self, node: Node) -> String {
        format!("127.0.0.1:{}", self.server(node).port())
    }

    /// Moves `slots` slots, keys and all, from the primary `from` to the primary `to` with
    /// `redis-cli --cluster reshard` (slot by slot: IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE,
    /// as an operator runs it), and waits until every node agrees.
    pub fn reshard(&self, from: Node, to: Node, slots: u16) {
        let args = [
            "reshard",
            &self.address(self.live_node()),
            "--cluster-from",
            self.id(from),
            "--cluster-to",
            self.id(to),
            "--cluster-slots",
            &slots.to_string(),
            "--cluster-yes",
        ];
        self.cluster_tool(&args.map(String::from));
        self.wait_until_ok("the cluster to agree after a reshard", CHANGING);
    }

    /// `CLUSTER FAILOVER [FORCE]` on `replica`: waits until it serves its old primary's slots
    /// and every node agrees; returns the old primary (its replica now).
    pub fn failover(&self, replica: Node, how: Failover) -> Node {
        let view = self.view(replica);
        let me = (view.iter())
            .find(|node| node.id == self.id(replica))
            .unwrap_or_else(|| panic!("{replica:?} does not list itself: {view:?}"));
        let primary_id = (me.primary.clone())
            .unwrap_or_else(|| panic!("{replica:?} is not a replica: {view:?}"));
        let primary = (view.iter())
            .find(|node| node.id == primary_id)
            .map(|node| self.node_on(node.port))
            .unwrap_or_else(|| panic!("{replica:?}'s primary is unknown: {view:?}"));
        let mut command = vec!["CLUSTER", "FAILOVER"];
        if how == Failover::Force {
            command.push("FORCE");
        }
        self.command(replica, &command);
        self.wait_for_failover(primary, replica);
        primary
    }

    /// Starts a new node and joins it (`--cluster add-node`) as an empty primary.
    pub fn add_primary(&mut self) -> Node {
        self.add_node(&[])
    }

    /// Starts a new node and joins it as a replica of `primary`.
    pub fn add_replica(&mut self, primary: Node) -> Node {
        let id = self.id(primary).to_owned();
        self.add_node(&["--cluster-slave", "--cluster-master-id", &id])
    }

    fn add_node(&mut self, options: &[&str]) -> Node {
        let server = start_node();
        let id = server.command(&["CLUSTER", "MYID"]);
        let address = format!("127.0.0.1:{}", server.port());
        let existing = self.address(self.live_node());
        self.servers.push(server);
        self.ids.push(id);
        self.states.push(State::Live);
        let mut args = vec!["add-node".to_owned(), address, existing];
        args.extend(options.iter().map(|option| option.to_string()));
        self.cluster_tool(&args);
        self.wait_until_ok("a new node to join", CHANGING);
        Node(self.servers.len() - 1)
    }

    /// Spreads the slots evenly over every primary, empty ones included (`--cluster rebalance
    /// --cluster-use-empty-masters`), and waits until every node agrees.
    pub fn rebalance(&self) {
        let args = [
            "rebalance",
            &self.address(self.live_node()),
            "--cluster-use-empty-masters",
        ];
        self.cluster_tool(&args.map(String::from));
        self.wait_until_ok("the cluster to agree after a rebalance", CHANGING);
    }

    /// Takes `node` out of the cluster as an operator does: a primary's slots are moved to
    /// the other primaries first (`rebalance` with its weight 0), then `--cluster del-node`
    /// makes every node forget it and stops it.
    pub fn remove(&mut self, node: Node) {
        let address = self.address(node);
        let serves_slots = self.primaries().contains(&node);
        if serves_slots {
            let weight = format!("{}=0", self.id(node));
            let args = [
                "rebalance",
                &address,
                "--cluster-weight",
                &weight,
                "--cluster-use-empty-masters",
            ];
            self.cluster_tool(&args.map(String::from));
            self.wait_until_ok("the slots to leave a node", CHANGING);
        }
        let other = (self.live_nodes())
            .find(|&other| other != node)
            .expect("another live node");
        let args = ["del-node", &self.address(other), self.id(node)];
        self.cluster_tool(&args.map(String::from));
        self.servers[node.0].kill();
        self.states[node.0] = State::Removed;
        self.wait_until_ok("the cluster to forget a removed node", CHANGING);
    }

    /// Stops `node` (SIGTERM) and starts it again on the same port and directory: it rejoins
    /// from its `nodes.conf`, empty (nothing is persisted), and syncs from its primary. Waits
    /// until the cluster is whole again. Restart only a replica: a primary restarted empty
    /// would take its slots back with no data (an upgrade fails it over first).
    pub fn restart(&mut self, node: Node) {
        self.servers[node.0].restart();
        self.states[node.0] = State::Live;
        self.wait_until_ok("a restarted node to rejoin", CHANGING);
    }

    /// An upgrade's rolling restart: every replica restarted in turn, then every primary
    /// failed over to its replica (gracefully) and restarted as a replica.
    pub fn rolling_restart(&mut self) {
        let primaries = self.primaries();
        for &primary in &primaries {
            let replica = self.replica_of(primary);
            self.restart(replica);
        }
        for primary in primaries {
            let replica = self.replica_of(primary);
            self.failover(replica, Failover::Graceful);
            self.restart(primary);
        }
    }

    /// Waits until the replica of the killed `primary` serves its slots and the cluster is
    /// whole again; returns the new primary.
    pub fn wait_for_failover(&self, primary: Node, replica: Node) -> Node {
        let deadline = Instant::now() + FAILOVER;
        loop {
            let promoted = self
                .view(replica)
                .iter()
                .any(|node| node.id == self.id(replica) && node.is_primary());
            if promoted {
                break;
            }
            if Instant::now() > deadline {
                panic!(
                    "{replica:?} did not replace the killed {primary:?} within {FAILOVER:?}\n{}",
                    self.report()
                );
            }
            std::thread::sleep(POLL);
        }
        self.wait_until_ok("the cluster to settle after the failover", FAILOVER);
        replica
    }

    /// Polls every live node until the cluster is whole: state ok, all slots served by live
    /// primaries, replicas in sync, and one view of who serves what and who replicates whom on
    /// every node.
    pub fn wait_until_ok(&self, what: &str, bound: Duration) {
        let deadline = Instant::now() + bound;
        loop {
            match self.whole() {
                Ok(()) => return,
                Err(_) if Instant::now() < deadline => std::thread::sleep(POLL),
                Err(reason) => panic!(
                    "timed out after {bound:?} waiting for {what}: {reason}\n{}",
                    self.report()
                ),
            }
        }
    }

    /// Why the cluster is not whole yet, if it is not.
    fn whole(&self) -> Result<(), String> {
        let mut assignments = Vec::new();
        for node in self.live_nodes() {
            let info = self.try_command(node, &["CLUSTER", "INFO"])?;
            for expected in [
                "cluster_state:ok".to_owned(),
                format!("cluster_slots_ok:{SLOTS}"),
            ] {
                if !info.lines().any(|line| line.trim() == expected) {
                    return Err(format!("{node:?} lacks {expected}"));
                }
            }
            let view = parse_nodes(&self.try_command(node, &["CLUSTER", "NODES"])?);
            let members = self.states.iter().filter(|&&s| s != State::Removed);
            if view.len() != members.count() {
                return Err(format!("{node:?} knows {} nodes", view.len()));
            }
            for other in &view {
                let other_node = self.node_on(other.port);
                if (self.states[other_node.0] == State::Killed) == other.is_failing() {
                    continue;
                }
                return Err(format!("{node:?} sees {other_node:?} as {:?}", other.flags));
            }
            // Who serves what and who replicates whom: a demoted primary is listed as a
            // slot-less primary until gossip tells each node it is a replica now.
            let mut assignment: Vec<Seat> = view.iter().map(NodeView::seat).collect();
            assignment.sort();
            assignments.push(assignment);
            let me = view
                .iter()
                .find(|other| other.flags.iter().any(|flag| flag == "myself"))
                .ok_or_else(|| format!("{node:?} does not list itself"))?;
            if !me.is_primary() {
                let replication = self.try_command(node, &["INFO", "replication"])?;
                if !replication.contains("master_link_status:up") {
                    return Err(format!("replica {node:?} is not in sync"));
                }
            }
        }
        if assignments.windows(2).any(|pair| pair[0] != pair[1]) {
            return Err(format!("nodes disagree on roles or slots: {assignments:?}"));
        }
        Ok(())
    }

    /// `redis-cli --cluster create`, bounded; panics with its output on failure.
    fn create(&self) {
        let mut args = vec!["create".to_owned()];
        args.extend((self.servers.iter()).map(|server| format!("127.0.0.1:{}", server.port())));
        args.extend(["--cluster-replicas", "1", "--cluster-yes"].map(String::from));
        self.cluster_tool(&args);
    }

    /// `redis-cli --cluster <args>` (or `valkey-cli`), bounded by [`CHANGING`]; panics with
    /// its output and the cluster's state on failure. Its output on success.
    fn cluster_tool(&self, args: &[String]) -> String {
        let output = tempfile::NamedTempFile::new().expect("a temporary file");
        let cli = Flavor::current().cli();
        let mut child = Command::new(&cli)
            .arg("--cluster")
            .args(args)
            .stdin(Stdio::null())
            .stdout(output.reopen().expect("reopen the output file"))
            .stderr(output.reopen().expect("reopen the output file"))
            .spawn()
            .unwrap_or_else(|e| panic!("{} runs (is it installed?): {e}", cli.display()));
        let deadline = Instant::now() + CHANGING;
        let status = loop {
            if let Some(status) = child.try_wait().expect("waiting for the cluster tool") {
                break Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(POLL);
        };
        let printed = std::fs::read_to_string(output.path()).unwrap_or_default();
        if status.is_some_and(|status| status.success()) {
            return printed;
        }
        panic!(
            "{} --cluster {}: {:?}\n{printed}\n{}",
            cli.display(),
            args.join(" "),
            status.map_or_else(
                || format!("still running after {CHANGING:?}"),
                |s| s.to_string()
            ),
            self.report()
        );
    }

    /// One node's CLUSTER NODES.
    fn view(&self, node: Node) -> Vec<NodeView> {
        parse_nodes(&self.command(node, &["CLUSTER", "NODES"]))
    }

    fn node_on(&self, port: u16) -> Node {
        let index = self
            .servers
            .iter()
            .position(|server| server.port() == port)
            .unwrap_or_else(|| panic!("no node of this cluster listens on port {port}"));
        Node(index)
    }

    fn live_nodes(&self) -> impl Iterator<Item = Node> + '_ {
        (self.nodes().into_iter()).filter(|node| self.states[node.0] == State::Live)
    }

    fn live_node(&self) -> Node {
        self.live_nodes().next().expect("a live node")
    }

    /// A command that may fail while the cluster forms: the error as text.
    fn try_command(&self, node: Node, args: &[&str]) -> Result<String, String> {
        let server = self.server(node);
        let mut connection = server
            .client()
            .get_connection_with_timeout(Duration::from_secs(2))
            .map_err(|e| format!("connect to {node:?}: {e}"))?;
        let (name, rest) = args.split_first().expect("a command has a name");
        redis::cmd(name)
            .arg(rest)
            .query::<String>(&mut connection)
            .map_err(|e| format!("{args:?} on {node:?}: {e}"))
    }

    /// What each node says of the cluster, and the end of its log: for failure messages.
    pub fn report(&self) -> String {
        let mut report = String::new();
        for node in self.nodes() {
            let server = self.server(node);
            let _ = writeln!(report, "--- {node:?} port {}", server.port());
            if self.states[node.0] != State::Live {
                let _ = writeln!(report, "({:?})", self.states[node.0]);
            } else {
                for args in [&["CLUSTER", "INFO"][..], &["CLUSTER", "NODES"]] {
                    let answer = self.try_command(node, args).unwrap_or_else(|e| e);
                    let _ = writeln!(report, "{}", answer.trim_end());
                }
            }
            report.push_str(&server.log_tail(15));
        }
        report
    }
}

/// Starts one cluster-enabled node on a fresh port and bus port (Redis 7's `cluster-port`:
/// the default bus port, port + 10000, may be taken or beyond 65535).
fn start_node() -> RedisServer {
    let mut failures = Vec::new();
    for _ in 0..ATTEMPTS {
        let bus = free_port().to_string();
        let options = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            NODE_TIMEOUT_MS,
            "--cluster-port",
            &bus,
            // A replica may always take over, however long ago it last heard its primary:
            // on a loaded machine that can be longer than the default allows.
            "--cluster-replica-validity-factor",
            "0",
            // A primary syncs its replica at once instead of waiting 5 s for more replicas.
            "--repl-diskless-sync-delay",
            "0",
        ];
        match RedisServer::try_start(free_port(), &options) {
            Ok(server) => return server,
            Err(failure) => failures.push(failure),
        }
    }
    panic!(
        "a cluster node did not start after {ATTEMPTS} attempts:\n{}",
        failures.join("\n")
    );
}

/// Parses CLUSTER NODES: `<id> <ip:port@bus> <flags> <primary|-> <ping> <pong> <epoch>
/// <link> <slot>…`.
fn parse_nodes(text: &str) -> Vec<NodeView> {
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let port = fields[1]
                .split(['@', ','])
                .next()
                .and_then(|address| address.rsplit(':').next())
                .and_then(|port| port.parse().ok())
                .unwrap_or_else(|| panic!("no port in CLUSTER NODES line {line:?}"));
            let slots = fields[8..]
                .iter()
                .filter(|range| !range.starts_with('['))
                .map(|range| {
                    let (first, last) = range.split_once('-').unwrap_or((range, range));
                    let parse = |slot: &str| -> u16 {
                        slot.parse()
                            .unwrap_or_else(|_| panic!("bad slot in CLUSTER NODES line {line:?}"))
                    };
                    (parse(first), parse(last))
                })
                .collect();
            NodeView {
                id: fields[0].to_owned(),
                port,
                flags: fields[2].split(',').map(str::to_owned).collect(),
                primary: (fields[3] != "-").then(|| fields[3].to_owned()),
                slots,
            }
        })
        .collect()
}

fn serves(node: &NodeView, slot: u16) -> bool {
    node.slots
        .iter()
        .any(|&(first, last)| (first..=last).contains(&slot))
}
