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
//! by its slot, following redirects (`cluster/redirect.rs`), and the map is read again in the
//! background.
//!
//! **A failure costs only the slots it touches.** Every node has a connection of floodgate's
//! own (`cluster/node.rs`) and every primary a circuit breaker (`cluster/topology.rs`): a
//! primary that dies fails the hits of its slots, by their rules' policies, until the map
//! names its replacement, and nothing else. (The redis crate's shared cluster connection did
//! not allow this: a node it could not reach made it reconnect to the seeds and read the map
//! again while every other call waited, one breaker guarded the whole cluster, and the crate
//! kept its own map, which could go on naming a dead node.)
//!
//! **Bounded.** The request's deadline (the caller's, or `command_timeout` from its start)
//! bounds every wait, and each call with its redirects waits at most `command_timeout`
//! besides. A call that misses it fails alone, so counters on healthy primaries still answer
//! while one primary fails over. `pool_size` does not apply: one multiplexed connection per
//! node carries every request.

mod node;
mod redirect;
mod topology;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis;
use futures_util::future::BoxFuture;
use tokio::time::{Instant, timeout_at};

use crate::backend::breaker::BreakerSettings;
use crate::backend::{
    BackendError, CounterHit, RemoteStore, give_backs, rejects, settle_give_backs,
};
use crate::clock::Clock;
use crate::limiter::{CounterKey, Decision, Limit};

use super::batcher::{PATIENT, Shared};
use super::script::{RedisHit, Scripts};
use super::slots::{Node, not_served_here};
use super::{RedisOptions, request_deadline, seeds};
use node::NodeConnector;
use redirect::run_call;
pub(super) use topology::Topology;

/// A Redis Cluster reached through a list of seed nodes.
pub struct RedisClusterBackend {
    topology: Arc<Topology>,
    options: RedisOptions,
}

impl RedisClusterBackend {
    /// `options.url` is a comma-separated list of seed node URLs; any reachable one reveals
    /// the whole cluster. Each primary gets a circuit breaker with `breakers`' settings. No
    /// connection is made yet: a cluster that is down at start-up is a backend failure for
    /// the requests, not a reason to refuse to start.
    pub fn new(
        options: RedisOptions,
        clock: Arc<dyn Clock>,
        breakers: BreakerSettings,
    ) -> Result<Self, BackendError> {
        options.check_key_prefix()?;
        let urls = seeds(&options.url)?;
        let connector = NodeConnector::new(&options, urls[0])?;
        let seeds = (urls.iter())
            .map(|url| NodeConnector::seed(url))
            .collect::<Result<Vec<Node>, BackendError>>()?;
        let shared = Arc::new(Shared {
            scripts: Scripts::new(),
            command_timeout: options.command_timeout,
            connect_timeout: options.connect_timeout,
            clock,
        });
        Ok(RedisClusterBackend {
            topology: Arc::new(Topology::new(connector, seeds, shared, breakers)),
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
    /// primary's lane, through its breaker, which sends them with other requests' in one
    /// script call. A hit the node no longer serves (a stale slot map), or whose slot the
    /// map does not know, is sent again on its own, routed by its slot and following
    /// redirects. Any failure has the map read again soon.
    async fn hit_all_until(
        &self,
        hits: &[CounterHit<'_>],
        deadline: Instant,
    ) -> Vec<Result<Decision, BackendError>> {
        if hits.is_empty() {
            return Vec::new();
        }
        let topology = &self.topology;
        let hits: Vec<RedisHit> = hits.iter().map(|hit| self.options.redis_hit(hit)).collect();
        let mut results: Vec<Option<Result<Decision, BackendError>>> = vec![None; hits.len()];
        let map = topology.map_by(deadline).await;
        let Some(map) = map else {
            if !topology.healthy() {
                let open = BackendError::CircuitOpen("the redis cluster did not answer".into());
                return vec![Err(open); hits.len()];
            }
            return self.resend(&hits, deadline).await;
        };
        let mut by_node: HashMap<&Node, Vec<usize>> = HashMap::new();
        for (index, hit) in hits.iter().enumerate() {
            if let Some(node) = map.node_of(hit.key.as_bytes()) {
                by_node.entry(node).or_default().push(index);
            }
        }
        let decided = by_node.into_iter().map(|(node, indices)| {
            let queued = indices.iter().map(|&i| hits[i].clone()).collect();
            async move {
                (
                    (node, indices),
                    topology.decide_on(node, queued, deadline).await,
                )
            }
        });
        let mut stale = false;
        // A node that said it does not serve a key knows who does.
        let mut informed = None;
        for ((node, indices), answers) in futures_util::future::join_all(decided).await {
            for (index, answer) in indices.into_iter().zip(answers) {
                match answer {
                    Err(BackendError::Unavailable(message)) if not_served_here(&message) => {
                        stale = true;
                        informed = Some(node.clone());
                    }
                    answer => {
                        stale |= answer.as_ref().is_err_and(|error| {
                            !matches!(error, BackendError::Overloaded(_) | BackendError::Late)
                        });
                        results[index] = Some(answer);
                    }
                }
            }
        }
        if stale {
            topology.read_soon_asking(informed);
        }
        let unanswered: Vec<usize> = (0..hits.len()).filter(|&i| results[i].is_none()).collect();
        if !unanswered.is_empty() {
            let alone: Vec<RedisHit> = unanswered.iter().map(|&i| hits[i].clone()).collect();
            let resent = self.resend(&alone, deadline).await;
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
    async fn resend(
        &self,
        hits: &[RedisHit],
        deadline: Instant,
    ) -> Vec<Result<Decision, BackendError>> {
        let timeout = self.options.command_timeout;
        // A patient request (a lease's take) keeps its own deadline: cut to the command
        // timeout, a reply that comes after it would be a block counted and never used.
        let now = Instant::now();
        let deadline = if deadline >= now + PATIENT {
            deadline
        } else {
            deadline.min(now + timeout)
        };
        let local_now = self.topology.shared.clock.now_micros();
        futures_util::future::join_all(hits.iter().map(|hit| async move {
            // Redis must not run a call after its sender gave up on it.
            let redis_deadline = self.redis_deadline(&hit.key, deadline);
            let run = run_call(&self.topology, hit, redis_deadline, local_now);
            match timeout_at(deadline, run).await {
                Ok(result) => result,
                Err(_) => Err(BackendError::Timeout(timeout)),
            }
        }))
        .await
    }

    /// `deadline` on the clock of the primary the slot map names for `key`, as far as its
    /// lane knows it; `None` when there is no such lane yet.
    fn redis_deadline(&self, key: &str, deadline: Instant) -> Option<u64> {
        let map = self.topology.map()?;
        let node = map.node_of(key.as_bytes())?;
        self.topology
            .known_primary(node)?
            .lane
            .redis_time_at(deadline)
    }

    /// Deletes the state of the counters `keys` (full keys, each with its limit), one DEL
    /// per counter on the primary the map names for it (a counter's keys share a slot,
    /// different counters do not); how many keys existed.
    pub async fn delete(&self, keys: &[(String, Limit)]) -> Result<u64, BackendError> {
        let deadline = Instant::now() + self.options.connect_timeout + self.options.command_timeout;
        let map = self.topology.map_by(deadline).await.ok_or_else(|| {
            BackendError::NothingCounted("the redis cluster's slot map could not be read".into())
        })?;
        let now = self.topology.shared.clock.now_micros();
        let mut deleted = 0;
        for (key, limit) in keys {
            let node = map.node_of(key.as_bytes()).ok_or_else(|| {
                BackendError::NothingCounted(format!("no redis cluster primary serves {key}"))
            })?;
            let names = super::script::nearby_state_keys(key, limit, now);
            let reply = self
                .topology
                .connection(node)
                .query(redis::cmd("DEL").arg(&names))
                .await?;
            let gone: u64 = redis::from_redis_value(reply).map_err(|e| {
                self.topology.read_soon();
                BackendError::Unavailable(format!("redis: {e}"))
            })?;
            deleted += gone;
        }
        Ok(deleted)
    }

    /// The quickest round trip lately to the primary where it is longest; `None` before
    /// any was measured.
    pub fn quickest_round_trip(&self) -> Option<Duration> {
        (self.topology.known_primaries().iter())
            .filter_map(|primary| primary.lane.quickest_round_trip())
            .max()
    }

    /// Reads the slot map and loads every script on every node it names, replicas included:
    /// SCRIPT LOAD is not replicated, and a replica promoted by a failover needs them (one
    /// the cluster did not list yet gets them on its first NOSCRIPT). At start-up.
    pub async fn load_scripts(&self) -> Result<(), BackendError> {
        let bound = self.options.connect_timeout + self.options.command_timeout;
        tokio::time::timeout(bound * 2, self.topology.load_scripts_everywhere())
            .await
            .unwrap_or(Err(BackendError::Timeout(bound * 2)))
    }
}

impl RemoteStore for RedisClusterBackend {
    fn kind(&self) -> &'static str {
        "redis-cluster"
    }

    fn decide<'a>(
        &'a self,
        hits: &'a [CounterHit<'a>],
        all_or_nothing: bool,
        deadline: Option<Instant>,
    ) -> BoxFuture<'a, Vec<Result<Decision, BackendError>>> {
        match all_or_nothing {
            true => Box::pin(self.hit_all_or_give_back(hits, deadline)),
            false => Box::pin(self.hit_all(hits, deadline)),
        }
    }

    fn forget<'a>(
        &'a self,
        counters: &'a [(CounterKey, Limit)],
    ) -> BoxFuture<'a, Result<u64, BackendError>> {
        let keys = self.options.full_keys(counters);
        Box::pin(async move { self.delete(&keys).await })
    }

    fn probe(&self) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(self.load_scripts())
    }

    fn max_wait(&self) -> Duration {
        self.options.max_wait
    }

    fn round_trip(&self) -> Option<Duration> {
        self.quickest_round_trip()
    }

    fn own_breakers(&self) -> bool {
        true
    }

    fn healthy(&self) -> bool {
        self.topology.healthy()
    }

    fn probe_own_breakers(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.topology.probe_if_due())
    }

    fn open_at_start(&self, error: &dyn std::fmt::Display) {
        self.topology.open_at_start(error);
    }
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
            max_wait: Duration::from_millis(40),
            key_prefix: key_prefix.into(),
            username: None,
            password: None,
            sentinel_master: "mymaster".into(),
            tls: None,
        }
    }

    fn backend(url: &str, key_prefix: &str) -> Result<RedisClusterBackend, BackendError> {
        let breakers = BreakerSettings {
            failures: 5,
            window: Duration::from_secs(1),
            cooldown: Duration::from_millis(250),
        };
        RedisClusterBackend::new(options(url, key_prefix), Arc::new(SystemClock), breakers)
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
