//! Counters in a Redis Cluster: the same keys, script and replies as the standalone backend,
//! the hits grouped by the primary that serves their slot.
//!
//! **One call per primary.** The slot map (`CLUSTER SLOTS`, `slots.rs`) names each hit's
//! primary; each primary has a lane (`batcher.rs`) that sends the hits of every request
//! waiting for it as one script call, keys of many slots together (the script's cross-slot
//! flag), the primaries in parallel, so a request costs one round trip of wall time.
//!
//! **A stale map costs a resend, never a double count.** A hit whose key the primary no
//! longer serves fails on its first read, before it wrote anything; it is sent again alone,
//! by its slot, following redirects (`redirect.rs`), and the map is read again in the
//! background.
//!
//! **Bounded.** The request's deadline (the caller's, or `command_timeout` from its start)
//! bounds every wait, and each call with its redirects waits at most `command_timeout`
//! besides. A call that misses it fails alone, so counters on healthy primaries still answer
//! while one primary fails over.
//!
//! **One connection.** A cluster connection multiplexes every request over one connection per
//! node and repairs itself, so it is shared rather than pooled: a pool would check every
//! connection out with a PING to every primary, a second round trip per request. `pool_size`
//! does not apply here. Should the connection itself stop working (its driver task gone), the
//! circuit breaker's probe, which runs only while requests keep failing, drops it and the
//! next caller opens a new one.

use arc_swap::ArcSwapOption;
use deadpool_redis::redis;
use futures_util::future::BoxFuture;
use redis::Value;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::io::tcp::TcpSettings;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::{Instant, timeout_at};

use crate::backend::{BackendError, CounterHit, give_backs, rejects, settle_give_backs};
use crate::clock::Clock;
use crate::limiter::{Decision, Limit};

use super::batcher::{Lane, Link, Shared};
use super::deadline::RedisClock;
use super::redirect::{LONGEST_PAUSE, not_served_here, run_call};
use super::script::{Mode, RedisHit, Target};
use super::slots::{Node, SlotMap};
use super::{RedisOptions, Scripts, load_scripts, lock, redact, request_deadline, unavailable};

/// A Redis Cluster reached through a list of seed nodes.
pub struct RedisClusterBackend {
    connector: Arc<Connector>,
    /// The primaries of the slots, read from the cluster; `None` until first read.
    slots: Arc<ArcSwapOption<SlotMap>>,
    /// Held while the slot map is read; and when it last was, so a burst of stale answers
    /// reads it once.
    reading_slots: tokio::sync::Mutex<Option<Instant>>,
    /// One lane (queue, in-flight limit, script calls) per primary.
    lanes: Mutex<HashMap<Node, Arc<Lane<NodeLink>>>>,
    shared: Arc<Shared>,
    options: RedisOptions,
}

/// The one cluster connection, shared by every lane.
struct Connector {
    client: ClusterClient,
    /// Opened on first use, then kept: it follows topology changes by itself.
    connection: ArcSwapOption<ClusterConnection>,
    /// Held while opening a connection, so concurrent callers open one, not one each.
    connecting: tokio::sync::Mutex<()>,
}

/// A lane's link to one primary: the shared cluster connection, each call routed to the
/// node's address.
struct NodeLink {
    connector: Arc<Connector>,
    node: SingleNodeRoutingInfo,
    /// `host:port`, for the log.
    name: String,
}

impl Link for NodeLink {
    fn target(&self) -> Target {
        Target::Server
    }

    fn query<'a>(&'a self, command: &'a redis::Cmd) -> BoxFuture<'a, Result<Value, BackendError>> {
        Box::pin(async move {
            let mut connection = self.connector.connection().await?;
            let mut pipe = redis::pipe();
            pipe.ignore_errors().add_command(command.clone());
            let replies = connection
                .route_pipeline(pipe, 0, 1, self.node.clone())
                .await
                .map_err(unavailable)?;
            replies
                .into_iter()
                .next()
                .ok_or_else(|| BackendError::Protocol("no reply to the script call".into()))
        })
    }

    fn load_scripts<'a>(&'a self, scripts: &'a Scripts) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(
            async move { load_scripts(&mut self.connector.connection().await?, scripts).await },
        )
    }

    /// The cluster connection reconnects by itself; the backend reads the slot map again
    /// after a failed call.
    fn reset(&self) {}

    fn name(&self) -> &str {
        &self.name
    }
}

impl RedisClusterBackend {
    /// `options.url` is a comma-separated list of seed node URLs; any reachable one reveals
    /// the whole cluster. No connection is made yet: a cluster that is down at start-up is
    /// a backend failure for the requests, not a reason to refuse to start.
    pub fn new(options: RedisOptions, clock: Arc<dyn Clock>) -> Result<Self, BackendError> {
        options.check_key_prefix()?;
        let seeds = seeds(&options.url)?;
        // TCP_NODELAY, as for the standalone backend: redis-rs leaves Nagle on.
        let mut builder = ClusterClientBuilder::new(seeds)
            .tcp_settings(TcpSettings::default().set_nodelay(true))
            .connection_timeout(options.connect_timeout)
            .retries(0);
        if let Some(username) = &options.username {
            builder = builder.username(username);
        }
        if let Some(password) = &options.password {
            builder = builder.password(password.expose());
        }
        if let Some(certificates) = &options.tls {
            builder = builder.certs(certificates.certificates());
        }
        let client = builder.build().map_err(|e| {
            BackendError::Config(format!("redis cluster {:?}: {e}", redact(&options.url)))
        })?;
        Ok(RedisClusterBackend {
            connector: Arc::new(Connector {
                client,
                connection: ArcSwapOption::empty(),
                connecting: tokio::sync::Mutex::new(()),
            }),
            slots: Arc::new(ArcSwapOption::empty()),
            reading_slots: tokio::sync::Mutex::new(None),
            lanes: Mutex::new(HashMap::new()),
            shared: Arc::new(Shared {
                scripts: Scripts::new(),
                command_timeout: options.command_timeout,
                connect_timeout: options.connect_timeout,
                clock,
            }),
            options,
        })
    }

    /// Applies every hit, in order, each within the command timeout of this request (or by
    /// its own `deadline`, when that comes first).
    pub async fn hit_all(
        &self,
        hits: &[CounterHit<'_>],
        deadline: Option<Instant>,
    ) -> Vec<Result<Decision, BackendError>> {
        self.hit_all_until(hits, self.deadline(deadline)).await
    }

    /// The request's own deadline, or the command timeout from now when it has none.
    fn deadline(&self, requested: Option<Instant>) -> Instant {
        request_deadline(requested, self.options.command_timeout)
    }

    /// Applies every hit as [`hit_all`](Self::hit_all) does; then, if a binding hit was
    /// rejected, gives back what each allowed hit took, in one more round trip within the
    /// same command timeout. Different counters live in different slots, which no one script
    /// can span, so this is not atomic: until the give-back lands, other requests see the
    /// quota taken (they may be rejected, never admitted beyond a limit), and a give-back
    /// that fails leaves it taken, as `consume_on_reject: true` would (docs/redis.md).
    pub async fn hit_all_or_give_back(
        &self,
        hits: &[CounterHit<'_>],
        deadline: Option<Instant>,
    ) -> Vec<Result<Decision, BackendError>> {
        let deadline = self.deadline(deadline);
        let mut results = self.hit_all_until(hits, deadline).await;
        if !rejects(hits, &results) {
            return results;
        }
        let (taken, give_backs) = give_backs(hits, &results);
        let returned = self.hit_all_until(&give_backs, deadline).await;
        settle_give_backs(&mut results, taken, returned);
        results
    }

    /// Applies every hit, in order, each by `deadline`: the hits of each primary in that
    /// primary's lane, which sends them with other requests' in one script call. A hit the
    /// node no longer serves (a stale slot map), or whose slot the map does not know, is
    /// sent again on its own, routed by its slot and following redirects.
    async fn hit_all_until(
        &self,
        hits: &[CounterHit<'_>],
        deadline: Instant,
    ) -> Vec<Result<Decision, BackendError>> {
        if hits.is_empty() {
            return Vec::new();
        }
        let hits: Vec<RedisHit> = hits.iter().map(|hit| self.options.redis_hit(hit)).collect();
        let mut results: Vec<Option<Result<Decision, BackendError>>> = vec![None; hits.len()];
        let map = self.slot_map(deadline).await;
        if let Some(map) = &map {
            let mut by_node: HashMap<&Node, Vec<usize>> = HashMap::new();
            for (index, hit) in hits.iter().enumerate() {
                if let Some(node) = map.node_of(hit.key.as_bytes()) {
                    by_node.entry(node).or_default().push(index);
                }
            }
            let decided = by_node.into_iter().map(|(node, indices)| {
                let lane = self.lane(node);
                let queued = indices.iter().map(|&i| hits[i].clone()).collect();
                async move { (indices, lane.decide(queued, Mode::Each, deadline).await) }
            });
            let mut stale = false;
            for (indices, answers) in futures_util::future::join_all(decided).await {
                for (index, answer) in indices.into_iter().zip(answers) {
                    match answer {
                        Err(BackendError::Unavailable(message)) if not_served_here(&message) => {
                            stale = true;
                        }
                        answer => {
                            stale |= matches!(
                                answer,
                                Err(BackendError::Unavailable(_)
                                    | BackendError::NothingCounted(_)
                                    | BackendError::NotReady(_)
                                    | BackendError::Busy(_)
                                    | BackendError::Unsent { .. }
                                    | BackendError::Timeout(_))
                            );
                            results[index] = Some(answer);
                        }
                    }
                }
            }
            if stale {
                self.read_slots_soon();
            }
        }
        let unanswered: Vec<usize> = (0..hits.len()).filter(|&i| results[i].is_none()).collect();
        if !unanswered.is_empty() {
            // Redis must not run a call after its sender gave up on it.
            let gives_up = deadline.min(Instant::now() + self.options.command_timeout);
            let calls: Vec<(&RedisHit, Option<u64>)> = (unanswered.iter())
                .map(|&i| {
                    let deadline = self.redis_deadline(map.as_deref(), &hits[i].key, gives_up);
                    (&hits[i], deadline)
                })
                .collect();
            let resent = self.resend_until(&calls, deadline).await;
            for (index, answer) in unanswered.into_iter().zip(resent) {
                results[index] = Some(answer);
            }
        }
        (results.into_iter())
            .map(|answer| answer.unwrap_or_else(|| Err(BackendError::Protocol("no answer".into()))))
            .collect()
    }

    /// Sends each hit in a call of its own (with the deadline, on its server's clock, past
    /// which the call must decide nothing), routed by its slot and following redirects, by
    /// `deadline` and within the command timeout.
    async fn resend_until(
        &self,
        calls: &[(&RedisHit, Option<u64>)],
        deadline: Instant,
    ) -> Vec<Result<Decision, BackendError>> {
        let timeout = self.options.command_timeout;
        let deadline = deadline.min(Instant::now() + timeout);
        let connection = match timeout_at(deadline, self.connector.connection()).await {
            Ok(Ok(connection)) => connection,
            Ok(Err(error)) => return vec![Err(error); calls.len()],
            Err(_) => return vec![Err(BackendError::Timeout(timeout)); calls.len()],
        };
        let local_now = self.shared.clock.now_micros();
        futures_util::future::join_all(calls.iter().map(|&(hit, redis_deadline)| {
            let connection = connection.clone();
            async move {
                let scripts = &self.shared.scripts;
                let run = run_call(connection, scripts, hit, redis_deadline, local_now);
                match timeout_at(deadline, run).await {
                    Ok(result) => result,
                    Err(_) => Err(BackendError::Timeout(timeout)),
                }
            }
        }))
        .await
    }

    /// `deadline` on the clock of the primary the slot map names for `key`, as far as its
    /// lane knows it; `None` when there is no such lane yet.
    fn redis_deadline(&self, map: Option<&SlotMap>, key: &str, deadline: Instant) -> Option<u64> {
        let node = map?.node_of(key.as_bytes())?;
        let lane = lock(&self.lanes).get(node)?.clone();
        lane.redis_time_at(deadline)
    }

    /// The full Redis key of `key`: the settings' prefix, then the counter key.
    pub fn full_key(&self, key: &str) -> String {
        format!("{}{key}", self.options.key_prefix)
    }

    /// Deletes the state of the counters `keys` (full keys, each with its limit), one DEL
    /// per counter (a counter's keys share a slot, different counters do not); how many
    /// keys existed.
    pub async fn delete(&self, keys: &[(String, Limit)]) -> Result<u64, BackendError> {
        let mut connection = self.connector.connection().await?;
        let now = self.shared.clock.now_micros();
        let mut deleted = 0;
        for (key, limit) in keys {
            let names = super::script::nearby_state_keys(key, limit, now);
            let gone: u64 = redis::cmd("DEL")
                .arg(&names)
                .query_async(&mut connection)
                .await
                .map_err(unavailable)?;
            deleted += gone;
        }
        Ok(deleted)
    }

    /// The quickest round trip lately to the primary where it is longest; `None` before
    /// any was measured.
    pub fn quickest_round_trip(&self) -> Option<Duration> {
        (lock(&self.lanes).values())
            .filter_map(|lane| lane.quickest_round_trip())
            .max()
    }

    /// The lane of `node`, made on first use.
    fn lane(&self, node: &Node) -> Arc<Lane<NodeLink>> {
        let mut lanes = lock(&self.lanes);
        if let Some(lane) = lanes.get(node) {
            return lane.clone();
        }
        let link = NodeLink {
            connector: self.connector.clone(),
            node: SingleNodeRoutingInfo::ByAddress {
                host: node.host.clone(),
                port: node.port,
            },
            name: format!("{}:{}", node.host, node.port),
        };
        // Each primary has its own clock.
        let lane = Arc::new(Lane::new(
            link,
            self.shared.clone(),
            Arc::new(RedisClock::new()),
        ));
        lanes.insert(node.clone(), lane.clone());
        lane
    }

    /// The slot map, read from the cluster first if there is none yet (by `deadline`);
    /// `None` when it cannot be read, and every hit goes by its slot alone.
    async fn slot_map(&self, deadline: Instant) -> Option<Arc<SlotMap>> {
        if let Some(map) = self.slots.load_full() {
            return Some(map);
        }
        timeout_at(deadline, self.read_slots()).await.ok()?;
        self.slots.load_full()
    }

    /// Reads the slot map again in the background, at most once per [`LONGEST_PAUSE`]: the
    /// request that noticed the change does not wait for it.
    fn read_slots_soon(&self) {
        let Ok(mut last) = self.reading_slots.try_lock() else {
            return;
        };
        if last.is_some_and(|at| at.elapsed() < LONGEST_PAUSE) {
            return;
        }
        *last = Some(Instant::now());
        let (connector, slots) = (self.connector.clone(), self.slots.clone());
        tokio::spawn(async move {
            if let Some(map) = read_slot_map(&connector).await {
                slots.store(Some(Arc::new(map)));
            }
        });
    }

    /// Reads the slot map from the cluster and puts it in force, unless another request just
    /// tried (a cluster that cannot answer is not asked once per request).
    async fn read_slots(&self) {
        let mut last = self.reading_slots.lock().await;
        if self.slots.load().is_some() || last.is_some_and(|at| at.elapsed() < LONGEST_PAUSE) {
            return;
        }
        *last = Some(Instant::now());
        if let Some(map) = read_slot_map(&self.connector).await {
            self.slots.store(Some(Arc::new(map)));
        }
    }

    /// Loads every script on every node the cluster lists, replicas included: SCRIPT LOAD is
    /// not replicated, and a replica promoted by a failover needs them (one the cluster did
    /// not list yet gets them on its first NOSCRIPT). At start-up, and as the circuit
    /// breaker's probe: a failure then also drops the connection, in case it is the
    /// connection that is broken rather than the cluster.
    pub async fn load_scripts(&self) -> Result<(), BackendError> {
        let bound = self.options.connect_timeout + self.options.command_timeout;
        let load = async {
            let mut connection = self.connector.connection().await?;
            load_scripts(&mut connection, &self.shared.scripts).await
        };
        let result = tokio::time::timeout(bound, load)
            .await
            .unwrap_or(Err(BackendError::Timeout(bound)));
        if result.is_err() {
            self.connector.connection.store(None);
        }
        result
    }
}

impl Connector {
    /// The shared cluster connection, opened by the first caller that needs it. A failed or
    /// abandoned attempt leaves it unopened for the next caller.
    async fn connection(&self) -> Result<ClusterConnection, BackendError> {
        if let Some(connection) = self.connection.load_full() {
            return Ok(ClusterConnection::clone(&connection));
        }
        let _opening = self.connecting.lock().await;
        if let Some(connection) = self.connection.load_full() {
            return Ok(ClusterConnection::clone(&connection));
        }
        let connection = self
            .client
            .get_async_connection()
            .await
            .map_err(unavailable)?;
        self.connection.store(Some(Arc::new(connection.clone())));
        Ok(connection)
    }
}

/// The cluster's slot map, asked of any node; `None` (logged) when it cannot be read.
async fn read_slot_map(connector: &Connector) -> Option<SlotMap> {
    let read = async {
        let mut connection = connector.connection().await?;
        let reply = connection
            .route_command(
                redis::cmd("CLUSTER").arg("SLOTS").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await
            .map_err(unavailable)?;
        SlotMap::from_cluster_slots(&reply).map_err(BackendError::Protocol)
    };
    match read.await {
        Ok(map) => Some(map),
        Err(error) => {
            tracing::warn!(%error, "could not read the redis cluster's slot map");
            None
        }
    }
}

/// The URLs of a comma-separated list (cluster seeds, sentinels), blanks around them ignored.
pub(super) fn seeds(urls: &str) -> Result<Vec<&str>, BackendError> {
    let seeds: Vec<&str> = urls
        .split(',')
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .collect();
    if seeds.is_empty() {
        return Err(BackendError::Config("no URL in the redis url".into()));
    }
    Ok(seeds)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::clock::SystemClock;

    fn options(url: &str, key_prefix: &str) -> RedisOptions {
        RedisOptions {
            url: url.into(),
            pool_size: 4,
            connect_timeout: Duration::from_millis(250),
            command_timeout: Duration::from_millis(15),
            key_prefix: key_prefix.into(),
            username: None,
            password: None,
            sentinel_master: "mymaster".into(),
            tls: None,
        }
    }

    fn backend(url: &str, key_prefix: &str) -> Result<RedisClusterBackend, BackendError> {
        RedisClusterBackend::new(options(url, key_prefix), Arc::new(SystemClock))
    }

    #[test]
    fn seeds_are_the_comma_separated_urls() {
        assert_eq!(
            seeds(" redis://a:1/, redis://b:2/ ,,").expect("two seeds"),
            ["redis://a:1/", "redis://b:2/"]
        );
        assert!(backend("redis://127.0.0.1:7000/,redis://127.0.0.1:7001/", "").is_ok());
    }

    #[test]
    fn a_list_without_any_url_is_a_settings_error() {
        assert!(matches!(backend(" , ", ""), Err(BackendError::Config(_))));
    }

    #[test]
    fn a_prefix_with_a_brace_is_refused_so_the_hash_tag_stays_the_counters() {
        let error = backend("redis://127.0.0.1:7000/", "app{1}:").err();
        assert!(matches!(error, Some(BackendError::Config(message)) if message.contains("prefix")));
    }

    #[tokio::test]
    async fn an_unreachable_cluster_fails_every_hit_within_the_command_timeout() {
        use crate::backend::CounterHit;
        use crate::limiter::{CounterKey, Hits, Limit, Unit};
        use std::borrow::Cow;

        // Port 9 (discard) on loopback: nothing listens, connections are refused at once.
        let cluster = backend("redis://127.0.0.1:9/", "").expect("valid settings");
        let limit = Limit::per(5, Unit::Second);
        let hit = |name: &str| CounterHit {
            key: CounterKey::new("d", name, 0, &limit, []),
            limit: Cow::Borrowed(&limit),
            hits: Hits::take(1),
            binding: true,
        };
        let started = std::time::Instant::now();
        let results = cluster.hit_all(&[hit("a"), hit("b")], None).await;
        assert_eq!(results.len(), 2);
        assert!(results.iter().all(Result::is_err), "{results:?}");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
    }
}
