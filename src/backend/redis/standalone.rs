//! One standalone Redis server (a primary behind one address, or the primary Redis Sentinel
//! names): `pool_size` long-lived multiplexed connections, each with its queue in front
//! (`batcher.rs`), handed requests round-robin.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use deadpool_redis::redis;
use futures_util::future::BoxFuture;
use tokio::time::Instant;

use super::batcher::{Lane, Link, Shared};
use super::connect::{KeptConnection, PrimaryConnection, Source, redact};
use super::deadline::RedisClock;
use super::script::{self, Mode, Scripts, Target};
use super::{RedisOptions, load_scripts, request_deadline, unavailable};
use crate::backend::{BackendError, CounterHit, RemoteStore};
use crate::clock::Clock;
use crate::limiter::{CounterKey, Decision, Limit};

/// One standalone Redis server: a primary behind a single address, or the primary that
/// Redis Sentinel names.
pub struct RedisBackend {
    /// `pool_size` long-lived multiplexed connections, each with its queue (`batcher.rs`).
    lanes: Box<[Lane<ServerLink>]>,
    next: AtomicUsize,
    options: RedisOptions,
    /// This process's clock: which window's key a reset deletes.
    clock: Arc<dyn Clock>,
}

/// A lane's link to a standalone server: one multiplexed connection, opened from the
/// source when there is none.
struct ServerLink {
    source: Arc<Source>,
    connection: KeptConnection<PrimaryConnection>,
    /// The settings' URL, without credentials.
    name: String,
}

impl ServerLink {
    async fn connection(&self) -> Result<PrimaryConnection, BackendError> {
        self.connection.get(|| self.source.connect()).await
    }

    /// `result` of an exchange: an answer marks the connection used.
    fn answered<T>(&self, result: Result<T, BackendError>) -> Result<T, BackendError> {
        if result.is_ok() {
            self.connection.used();
        }
        result
    }
}

impl Link for ServerLink {
    fn target(&self) -> Target {
        Target::Server
    }

    fn query<'a>(
        &'a self,
        command: &'a redis::Cmd,
    ) -> BoxFuture<'a, Result<redis::Value, BackendError>> {
        Box::pin(async move {
            let reply = query_one(&mut self.connection().await?, command).await;
            self.answered(reply)
        })
    }

    fn load_scripts<'a>(&'a self, scripts: &'a Scripts) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            let loaded = load_scripts(&mut self.connection().await?, scripts).await;
            self.answered(loaded)
        })
    }

    fn reset(&self) {
        self.connection.drop_current();
    }

    fn name(&self) -> &str {
        &self.name
    }
}

impl RedisBackend {
    /// A backend on the one server of `options.url`. No connection is made yet: a Redis
    /// that is down at start-up is a backend failure for the requests, handled by each
    /// rule's `on_backend_error`, not a reason to refuse to start.
    pub fn new(options: RedisOptions, clock: Arc<dyn Clock>) -> Result<Self, BackendError> {
        Self::with_source(Source::direct(&options)?, options, clock)
    }

    /// A backend on the primary that the sentinels of `options.url` name
    /// `options.sentinel_master`, whichever server that is when a connection is opened.
    pub fn sentinel(options: RedisOptions, clock: Arc<dyn Clock>) -> Result<Self, BackendError> {
        Self::with_source(Source::sentinel(&options)?, options, clock)
    }

    fn with_source(
        source: Source,
        options: RedisOptions,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, BackendError> {
        options.check_key_prefix()?;
        let source = Arc::new(source);
        let shared = Arc::new(Shared {
            scripts: Scripts::new(),
            command_timeout: options.command_timeout,
            connect_timeout: options.connect_timeout,
            clock: clock.clone(),
        });
        let link = || ServerLink {
            source: source.clone(),
            connection: KeptConnection::new(options.connect_timeout),
            name: redact(&options.url),
        };
        // Every lane talks to one server, so they share what they learn of its clock.
        let redis_clock = Arc::new(RedisClock::new());
        Ok(RedisBackend {
            lanes: (0..options.pool_size.max(1))
                .map(|_| Lane::new(link(), shared.clone(), redis_clock.clone()))
                .collect(),
            next: AtomicUsize::new(0),
            options,
            clock,
        })
    }

    /// Applies every hit, in order, by `deadline` (the caller's; the command timeout from now
    /// when it gave none), each call to Redis bounded by the command timeout: each hit on its
    /// own, or (`all_or_nothing`) only if no binding hit is rejected, which Redis decides in
    /// one script so no other client sees the request half applied. A connection at capacity
    /// sheds the request at once ([`BackendError::Overloaded`]).
    pub async fn hit_all(
        &self,
        hits: &[CounterHit<'_>],
        all_or_nothing: bool,
        deadline: Option<Instant>,
    ) -> Vec<Result<Decision, BackendError>> {
        if hits.is_empty() {
            return Vec::new();
        }
        let options = &self.options;
        let deadline = request_deadline(deadline, options.command_timeout);
        let queued = hits.iter().map(|hit| options.redis_hit(hit)).collect();
        let mode = if all_or_nothing {
            Mode::AllOrNothing
        } else {
            Mode::Each
        };
        self.lane().decide(queued, mode, deadline).await
    }

    /// The quickest round trip to the server lately, of the connection where it is longest;
    /// `None` before any was measured.
    pub fn quickest_round_trip(&self) -> Option<Duration> {
        self.lanes
            .iter()
            .filter_map(Lane::quickest_round_trip)
            .max()
    }

    /// Opens every connection, reads the server's clock and loads the script (at start-up),
    /// so that the first requests wait for none of it; the first failure.
    pub async fn prepare(&self) -> Result<(), BackendError> {
        let prepared = futures_util::future::join_all(self.lanes.iter().map(Lane::prepare));
        prepared.await.into_iter().collect()
    }

    /// Loads the script on the server (the breaker's probe), within the connect and command
    /// timeouts.
    pub async fn load_scripts(&self) -> Result<(), BackendError> {
        let options = &self.options;
        let bound = options.connect_timeout + options.command_timeout;
        tokio::time::timeout(bound, self.lane().load_scripts())
            .await
            .unwrap_or(Err(BackendError::Timeout(bound)))
    }

    /// Deletes the state of the counters `keys` (full Redis keys, each with its limit):
    /// every key a hit now, a window ago or a window ahead would use, so a clock a little
    /// apart from Redis' misses none; how many keys existed.
    pub async fn delete(&self, keys: &[(String, Limit)]) -> Result<u64, BackendError> {
        let now = self.clock.now_micros();
        let mut names: Vec<String> = keys
            .iter()
            .flat_map(|(key, limit)| script::nearby_state_keys(key, limit, now))
            .collect();
        names.sort();
        names.dedup();
        if names.is_empty() {
            return Ok(0);
        }
        let reply = self.lane().query(redis::cmd("DEL").arg(&names)).await?;
        redis::from_redis_value(reply).map_err(|e| BackendError::Protocol(e.to_string()))
    }

    /// The next lane, round-robin, passing over lanes whose connection is being set up
    /// while another is ready (a connection killed under load costs the requests it carried,
    /// not those that would wait for its replacement).
    fn lane(&self) -> &Lane<ServerLink> {
        let count = self.lanes.len();
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        (0..count)
            .map(|step| &self.lanes[(first + step) % count])
            .find(|lane| lane.is_ready())
            .unwrap_or(&self.lanes[first % count])
    }
}

impl RemoteStore for RedisBackend {
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn decide<'a>(
        &'a self,
        hits: &'a [CounterHit<'a>],
        all_or_nothing: bool,
        deadline: Option<Instant>,
    ) -> BoxFuture<'a, Vec<Result<Decision, BackendError>>> {
        Box::pin(self.hit_all(hits, all_or_nothing, deadline))
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

    fn prepare(&self) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(RedisBackend::prepare(self))
    }

    fn max_wait(&self) -> Duration {
        self.options.max_wait
    }

    fn round_trip(&self) -> Option<Duration> {
        self.quickest_round_trip()
    }
}

/// One command's reply, an error reply included (as a value, so NOSCRIPT can be told apart).
async fn query_one<C: redis::aio::ConnectionLike>(
    connection: &mut C,
    command: &redis::Cmd,
) -> Result<redis::Value, BackendError> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors().add_command(command.clone());
    let replies: Vec<redis::Value> = pipe.query_async(connection).await.map_err(unavailable)?;
    replies
        .into_iter()
        .next()
        .ok_or_else(|| BackendError::Protocol("no reply to the script call".into()))
}
