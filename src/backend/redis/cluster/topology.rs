//! What floodgate knows of a Redis Cluster: the slot map, a connection per node, and per
//! primary its lane and its circuit breaker.
//!
//! **The map follows the cluster.** It is read (`CLUSTER SLOTS`) from every primary it names
//! at once, the first answer taken, so a dead or unreachable node delays nothing; from the
//! replicas and seeds only when no primary answers (they learn a moved slot later).
//! It is read again, in the background and at most once per [`REREAD`], whenever a call finds
//! it stale or a primary fails, and while any primary's breaker is open: a primary lost and
//! replaced by its replica is known as replaced within [`REREAD`] of the cluster saying so.
//! A primary the new map no longer names loses its lane and breaker; a new one gets its own.
//!
//! **A failure is its primary's.** Each primary has a breaker: its failures open it for its
//! slots alone, and while it is open its hits are answered by their rules' policy at once.
//! The cluster is unhealthy (readiness, `/metrics`) only when every primary's breaker is open,
//! or before any map was read when the cluster did not answer at start.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use deadpool_redis::redis;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::time::Instant;

use crate::backend::breaker::{Admission, Breaker, BreakerSettings, BreakerState, CallEnd};
use crate::backend::{BackendError, outcome};
use crate::limiter::Decision;

use super::super::batcher::{Lane, Shared};
use super::super::deadline::RedisClock;
use super::super::lock;
use super::super::slots::{Node, SlotMap, not_served_here};
use super::node::{NodeConnection, NodeConnector, NodeLink};

/// The least time between two readings of the slot map (the one a failing call asks for, or
/// an open breaker's): a burst of stale answers reads it once.
pub(in crate::backend::redis) const REREAD: Duration = Duration::from_millis(100);

/// One primary: its queue of calls and its breaker.
pub(in crate::backend::redis) struct Primary {
    pub lane: Lane<NodeLink>,
    pub breaker: Breaker,
}

pub(in crate::backend::redis) struct Topology {
    connector: Arc<NodeConnector>,
    seeds: Vec<Node>,
    map: ArcSwapOption<SlotMap>,
    /// Held while the map is read, with when it was last read.
    reading: tokio::sync::Mutex<Option<Instant>>,
    connections: Mutex<HashMap<Node, Arc<NodeConnection>>>,
    primaries: Mutex<HashMap<Node, Arc<Primary>>>,
    pub shared: Arc<Shared>,
    breakers: BreakerSettings,
    /// The cluster as a whole before any map was read: opened when it did not answer at
    /// start, closed by the first map read.
    discovery: Breaker,
}

impl Topology {
    pub fn new(
        connector: NodeConnector,
        seeds: Vec<Node>,
        shared: Arc<Shared>,
        breakers: BreakerSettings,
    ) -> Self {
        let discovery = breakers.build(shared.clock.clone(), Some("the redis cluster".into()));
        Topology {
            connector: Arc::new(connector),
            seeds,
            map: ArcSwapOption::empty(),
            reading: tokio::sync::Mutex::new(None),
            connections: Mutex::new(HashMap::new()),
            primaries: Mutex::new(HashMap::new()),
            shared,
            breakers,
            discovery,
        }
    }

    pub fn map(&self) -> Option<Arc<SlotMap>> {
        self.map.load_full()
    }

    /// The map, read first if there is none yet (by `deadline`); `None` when it cannot be
    /// read, or when the cluster did not answer at start and its probe is not due.
    pub async fn map_by(self: &Arc<Self>, deadline: Instant) -> Option<Arc<SlotMap>> {
        if let Some(map) = self.map() {
            return Some(map);
        }
        if self.discovery.state() == BreakerState::Open {
            return None;
        }
        let _ = tokio::time::timeout_at(deadline, self.read_unless_recent(None)).await;
        self.map()
    }

    /// The connection to `node`, made on first use.
    pub fn connection(&self, node: &Node) -> Arc<NodeConnection> {
        let mut connections = lock(&self.connections);
        (connections.entry(node.clone()))
            .or_insert_with(|| Arc::new(NodeConnection::new(node.clone(), self.connector.clone())))
            .clone()
    }

    /// The primary `node`'s lane and breaker, made on first use.
    pub fn primary(&self, node: &Node) -> Arc<Primary> {
        if let Some(primary) = lock(&self.primaries).get(node) {
            return primary.clone();
        }
        let connection = self.connection(node);
        let primary = Arc::new(Primary {
            // Each primary has its own clock.
            lane: Lane::new(
                NodeLink(connection),
                self.shared.clone(),
                Arc::new(RedisClock::new()),
            ),
            breaker: (self.breakers).build(
                self.shared.clock.clone(),
                Some(format!("redis cluster primary {node}")),
            ),
        });
        let mut primaries = lock(&self.primaries);
        primaries.entry(node.clone()).or_insert(primary).clone()
    }

    /// The primary `node`'s state, if it has any yet.
    pub fn known_primary(&self, node: &Node) -> Option<Arc<Primary>> {
        lock(&self.primaries).get(node).cloned()
    }

    /// Every primary with a lane.
    pub fn known_primaries(&self) -> Vec<Arc<Primary>> {
        lock(&self.primaries).values().cloned().collect()
    }

    /// Decides `hits` on the primary `node`, through its breaker: refused at once while it
    /// is open. A hit the node does not serve (a stale map) is an answer for the breaker:
    /// the node is alive.
    pub async fn decide_on(
        &self,
        node: &Node,
        hits: Vec<super::super::script::RedisHit>,
        deadline: Instant,
    ) -> Vec<Result<Decision, BackendError>> {
        let primary = self.primary(node);
        let admission = primary.breaker.admit();
        if admission == Admission::Reject {
            let open =
                BackendError::CircuitOpen(format!("redis cluster primary {node} keeps failing"));
            return vec![Err(open); hits.len()];
        }
        let since = primary.breaker.now();
        let mode = super::super::script::Mode::Each;
        let answers = primary.lane.decide(hits, mode, deadline).await;
        let moved = (answers.iter()).any(|answer| {
            matches!(answer, Err(BackendError::Unavailable(message)) if not_served_here(message))
        });
        let ended = if moved {
            Some(CallEnd::Answered)
        } else {
            outcome(&answers)
        };
        match ended {
            Some(ended) => {
                if ended != CallEnd::Answered
                    && let Some(error) = answers.iter().find_map(|answer| answer.as_ref().err())
                {
                    primary.breaker.note_error(error);
                }
                primary.breaker.record(admission, ended, since);
            }
            None if admission == Admission::Probe => {
                primary.breaker.record(admission, CallEnd::TimedOut, since);
            }
            None => {}
        }
        answers
    }

    /// Reads the map again in the background, unless it was read within [`REREAD`] or is
    /// being read: the request that noticed a change does not wait for it.
    pub fn read_soon(self: &Arc<Self>) {
        self.read_soon_asking(None);
    }

    /// [`read_soon`](Self::read_soon), asking `first` before the others: a primary demoted by
    /// a failover knows its successor at once, where another node may learn it a moment later.
    pub fn read_soon_asking(self: &Arc<Self>, first: Option<Node>) {
        let Ok(last) = self.reading.try_lock() else {
            return;
        };
        if last.is_some_and(|at| at.elapsed() < REREAD) {
            return;
        }
        drop(last);
        let topology = self.clone();
        tokio::spawn(async move { topology.read_unless_recent(first).await });
    }

    /// Reads the map unless it was read within [`REREAD`] (or another caller is reading it:
    /// then waits for that reading).
    async fn read_unless_recent(&self, first: Option<Node>) {
        let mut last = self.reading.lock().await;
        if last.is_some_and(|at| at.elapsed() < REREAD) {
            return;
        }
        *last = Some(Instant::now());
        if let Some(first) = first
            && self
                .read_first_of(std::slice::from_ref(&first))
                .await
                .is_ok()
        {
            return;
        }
        if let Err(error) = self.read().await {
            tracing::warn!(%error, "could not read the redis cluster's slot map");
        }
    }

    /// Asks the primaries the map names for the map at once, and puts the first answer in
    /// force; if none answers, asks the other nodes it names and the seeds the same way. Each
    /// is asked within the connect and command timeouts, so a dead node delays nothing.
    ///
    /// Primaries first: `redis-cli --cluster` tells every primary a slot's new owner as it
    /// moves the slot, where replicas learn it a moment later by gossip, and a view that old
    /// put in force would send calls to a node that gave the slot away (or left the cluster).
    async fn read(&self) -> Result<(), BackendError> {
        let map = self.map();
        let primaries: Vec<Node> = (map.iter())
            .flat_map(|map| map.primaries().to_vec())
            .collect();
        let mut others: Vec<Node> = (map.iter())
            .flat_map(|map| map.members().cloned().collect::<Vec<_>>())
            .filter(|node| !primaries.contains(node))
            .collect();
        for seed in &self.seeds {
            if !primaries.contains(seed) && !others.contains(seed) {
                others.push(seed.clone());
            }
        }
        match self.read_first_of(&primaries).await {
            Ok(()) => Ok(()),
            Err(error) if others.is_empty() => Err(error),
            Err(_) => self.read_first_of(&others).await,
        }
    }

    /// Asks every node of `nodes` for the map at once and puts the first answer in force.
    async fn read_first_of(&self, nodes: &[Node]) -> Result<(), BackendError> {
        let bound = self.shared.connect_timeout + self.shared.command_timeout;
        let mut asked: FuturesUnordered<_> = (nodes.iter())
            .map(|node| {
                let connection = self.connection(node);
                async move {
                    let command = redis::cmd("CLUSTER").arg("SLOTS").clone();
                    let reply = tokio::time::timeout(bound, connection.query(&command))
                        .await
                        .unwrap_or(Err(BackendError::Timeout(bound)))?;
                    SlotMap::from_cluster_slots(&reply, connection.node())
                        .map_err(BackendError::Protocol)
                }
            })
            .collect();
        let mut last = BackendError::Config("no node to ask for the slot map".into());
        while let Some(answer) = asked.next().await {
            match answer {
                Ok(map) => {
                    self.install(map);
                    return Ok(());
                }
                Err(error) => last = error,
            }
        }
        Err(last)
    }

    /// Puts `map` in force: primaries it no longer names lose their lanes and breakers, nodes
    /// it does not name (and are no seeds) their connections.
    fn install(&self, map: SlotMap) {
        lock(&self.primaries).retain(|node, _| map.primaries().contains(node));
        lock(&self.connections).retain(|node, _| {
            map.members().any(|member| member == node) || self.seeds.contains(node)
        });
        self.map.store(Some(Arc::new(map)));
        if self.discovery.state() == BreakerState::Open {
            self.discovery
                .record(Admission::Probe, CallEnd::Answered, self.discovery.now());
        }
    }

    /// Reads the map and loads every script on every node it names, replicas included
    /// (SCRIPT LOAD is not replicated, and a promoted replica needs them); the first failure
    /// of a primary (a replica's is only logged: it decides nothing yet).
    pub async fn load_scripts_everywhere(&self) -> Result<(), BackendError> {
        *self.reading.lock().await = Some(Instant::now());
        self.read().await?;
        let Some(map) = self.map() else {
            return Err(BackendError::Protocol("no slot map".into()));
        };
        let bound = self.shared.connect_timeout + self.shared.command_timeout;
        let loads = map.members().map(|node| {
            let connection = self.connection(node);
            let primary = map.primaries().contains(node);
            async move {
                let load = connection.load_scripts(&self.shared.scripts);
                let loaded = (tokio::time::timeout(bound, load).await)
                    .unwrap_or(Err(BackendError::Timeout(bound)));
                if let (Err(error), false) = (&loaded, primary) {
                    tracing::info!(%error, replica = %node, "could not load the scripts on a replica yet");
                }
                (primary, loaded)
            }
        });
        let loaded = futures_util::future::join_all(loads).await;
        (loaded.into_iter())
            .filter(|(primary, _)| *primary)
            .try_for_each(|(_, loaded)| loaded)
    }

    /// Whether the cluster answers: any primary's breaker closed (a primary not called yet
    /// counts as closed); before any map, whether it answered at start.
    pub fn healthy(&self) -> bool {
        let Some(map) = self.map() else {
            return self.discovery.state() == BreakerState::Closed;
        };
        let primaries = lock(&self.primaries);
        map.primaries().iter().any(|node| {
            (primaries.get(node))
                .is_none_or(|primary| primary.breaker.state() == BreakerState::Closed)
        })
    }

    /// The cluster did not answer at start: its hits get their policy at once until a probe
    /// reads the map.
    pub fn open_at_start(&self, error: &dyn std::fmt::Display) {
        if self.map().is_none() {
            self.discovery.open_at_start(error);
        }
    }

    /// Probes what is due: before any map, the cluster (a map read); while a primary's
    /// breaker is open, the map again (it may have been replaced) and that primary (a
    /// SCRIPT LOAD through its lane).
    pub async fn probe_if_due(self: &Arc<Self>) {
        if self.map().is_none() {
            if self.discovery.admit() == Admission::Probe {
                let since = self.discovery.now();
                if let Err(error) = self.load_scripts_everywhere().await {
                    self.discovery.note_error(&error);
                    let end = CallEnd::Failed;
                    self.discovery.record(Admission::Probe, end, since);
                }
            }
            return;
        }
        let open: Vec<Arc<Primary>> = (self.known_primaries().into_iter())
            .filter(|primary| primary.breaker.state() == BreakerState::Open)
            .collect();
        if open.is_empty() {
            return;
        }
        self.read_soon();
        for primary in open {
            let admission = primary.breaker.admit();
            if admission != Admission::Probe {
                continue;
            }
            let since = primary.breaker.now();
            let bound = self.shared.connect_timeout + self.shared.command_timeout;
            let probe = tokio::time::timeout(bound, primary.lane.load_scripts()).await;
            let end = match probe.unwrap_or(Err(BackendError::Timeout(bound))) {
                Ok(()) => CallEnd::Answered,
                Err(error) => {
                    primary.breaker.note_error(&error);
                    match error {
                        BackendError::Timeout(_) | BackendError::NotReady(_) => CallEnd::TimedOut,
                        _ => CallEnd::Failed,
                    }
                }
            };
            primary.breaker.record(admission, end, since);
        }
    }

    /// A seed to send a call to when the map does not name the slot's primary.
    pub fn any_seed(&self) -> Option<&Node> {
        self.seeds.first()
    }
}
