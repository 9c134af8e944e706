//! Counters in Redis: every counter hit is decided inside Redis by floodgate's Lua script,
//! and one script call decides the hits of many requests at once.
//!
//! Connections: a `connect::Source` opens them (a deadpool-redis pool for one address, or
//! the sentinels' current primary); the backend keeps `pool_size` of them for good and hands
//! requests to them round-robin. Each is a multiplexed connection with a queue in front
//! (`batcher.rs`): the hits of the requests waiting on it go out as one call, and a request
//! that would queue beyond what Redis answers in time is shed at once instead of waiting. A
//! request never waits for a checkout — deadpool's recycle check costs a round trip of its
//! own (UNWATCH + PING) on every checkout, which measured as three Redis commands per
//! decision instead of one. A connection that breaks, or whose server turned replica
//! (READONLY), is dropped and replaced from the source.
//!
//! The script is loaded once (SCRIPT LOAD) and called by EVALSHA. A server that lost it
//! (restart, failover, SCRIPT FLUSH) answers NOSCRIPT and runs nothing; the call is sent
//! again after a reload, so nothing is counted twice. Every wait — for a new connection, for
//! a call's reply — is bounded by the command timeout (or the request's own deadline), so a
//! dead Redis answers in bounded time instead of piling requests up.

mod batcher;
mod cluster;
mod connect;
mod deadline;
mod redirect;
pub mod script;
pub mod slots;

pub use cluster::RedisClusterBackend;
pub use connect::{RedisTls, redact};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use deadpool_redis::redis;
use futures_util::future::BoxFuture;
use tokio::time::Instant;

use crate::backend::{BackendError, CounterHit};
use crate::clock::Clock;
use crate::limiter::{Decision, Limit};
use crate::settings::{Password, RedisSettings};
use batcher::{Lane, Link, Shared};
use connect::{PrimaryConnection, Source};
use deadline::RedisClock;
pub(crate) use script::Scripts;
use script::{Mode, RedisHit, Target};

/// How to reach Redis and how long to wait for it. `Debug` redacts the password.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisOptions {
    /// `redis://[user:password@]host:port[/db]` (`rediss://` for TLS); for a cluster or the
    /// sentinels, a comma-separated list.
    pub url: String,
    pub pool_size: usize,
    /// Bound on opening a new connection.
    pub connect_timeout: Duration,
    /// Bound on one request's whole exchange with Redis (waiting for a connection included).
    pub command_timeout: Duration,
    /// Put before every key, so several deployments can share one Redis. Must not contain
    /// `{` or `}` (the counter key's hash tag must stay the first one).
    pub key_prefix: String,
    /// Replaces the URL's user name (a Redis 6 ACL user) when set.
    pub username: Option<String>,
    /// Replaces the URL's password when set.
    pub password: Option<Password>,
    /// redis-sentinel: the name the sentinels monitor the primary under.
    pub sentinel_master: String,
    /// TLS files for `rediss://`: a CA to trust, and a client certificate (mutual TLS).
    pub tls: Option<RedisTls>,
}

impl RedisOptions {
    /// How to reach the main Redis the settings name, with `tls` (the files they name, read).
    pub fn from_settings(settings: &RedisSettings, tls: Option<RedisTls>) -> Self {
        RedisOptions {
            url: settings.url.clone(),
            pool_size: settings.pool_size,
            connect_timeout: Duration::from_millis(settings.connect_timeout_ms),
            command_timeout: Duration::from_millis(settings.command_timeout_ms),
            key_prefix: settings.key_prefix.clone(),
            username: settings.username.clone(),
            password: usable(&settings.password),
            sentinel_master: settings.sentinel_master.clone(),
            tls,
        }
    }

    /// How to reach `redis_per_second`'s Redis: its own address, credentials and pool, the
    /// main Redis' timeouts, key prefix and TLS files.
    pub fn per_second_from_settings(settings: &RedisSettings, tls: Option<RedisTls>) -> Self {
        let per_second = &settings.per_second;
        RedisOptions {
            url: per_second.url.clone(),
            pool_size: per_second.pool_size.unwrap_or(settings.pool_size),
            username: per_second.username.clone(),
            password: usable(&per_second.password),
            sentinel_master: per_second.sentinel_master.clone(),
            ..Self::from_settings(settings, tls)
        }
    }

    /// `hit` as Redis takes it: its counter's full key (the key prefix, then the counter key).
    fn redis_hit(&self, hit: &CounterHit<'_>) -> RedisHit {
        RedisHit {
            key: format!("{}{}", self.key_prefix, hit.key),
            limit: hit.limit.clone().into_owned(),
            hits: hit.hits,
            binding: hit.binding,
        }
    }

    /// The prefix goes before the counter key's `{…}` hash tag, which must stay the first
    /// brace pair in the key for Redis Cluster to hash the right part.
    fn check_key_prefix(&self) -> Result<(), BackendError> {
        if self.key_prefix.contains(['{', '}']) {
            return Err(BackendError::Config(format!(
                "redis key prefix {:?} must not contain '{{' or '}}'",
                self.key_prefix
            )));
        }
        Ok(())
    }
}

/// A password as a setting gives it: an empty one (a Kubernetes Secret key left blank) is
/// none.
fn usable(password: &Option<Password>) -> Option<Password> {
    password
        .clone()
        .filter(|password| !password.expose().is_empty())
}

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
    connection: Mutex<Option<PrimaryConnection>>,
    /// The settings' URL, without credentials.
    name: String,
}

impl ServerLink {
    async fn connection(&self) -> Result<PrimaryConnection, BackendError> {
        if let Some(connection) = lock(&self.connection).clone() {
            return Ok(connection);
        }
        let connection = self.source.connect().await?;
        *lock(&self.connection) = Some(connection.clone());
        Ok(connection)
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
        Box::pin(async move { query_one(&mut self.connection().await?, command).await })
    }

    fn load_scripts<'a>(&'a self, scripts: &'a Scripts) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move { load_scripts(&mut self.connection().await?, scripts).await })
    }

    fn reset(&self) {
        *lock(&self.connection) = None;
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
            connection: Mutex::new(None),
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

    /// The full Redis key of `key`: the settings' prefix, then the counter key.
    pub fn full_key(&self, key: &str) -> String {
        format!("{}{key}", self.options.key_prefix)
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

/// When a request must be answered: the caller's deadline, or `command_timeout` from now
/// when it gave none. (Each call to Redis is bounded by the command timeout besides.)
pub(crate) fn request_deadline(caller: Option<Instant>, command_timeout: Duration) -> Instant {
    caller.unwrap_or_else(|| Instant::now() + command_timeout)
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

/// SCRIPT LOAD of every script on the server behind `connection`.
pub(crate) async fn load_scripts<C: redis::aio::ConnectionLike>(
    connection: &mut C,
    scripts: &Scripts,
) -> Result<(), BackendError> {
    for script in scripts.all() {
        script.load_async(connection).await.map_err(unavailable)?;
    }
    Ok(())
}

/// A mutex that holds handles only: a panic elsewhere while it was locked leaves it usable.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn is_noscript(reply: &redis::Value) -> bool {
    matches!(reply, redis::Value::ServerError(error)
        if error.kind() == Some(redis::ServerErrorKind::NoScript))
}

fn unavailable(error: redis::RedisError) -> BackendError {
    BackendError::Unavailable(format!("redis: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_per_second_redis_has_its_own_address_and_the_main_ones_timeouts() {
        let env = [
            ("FLOODGATE_REDIS_URL", "redis://main:6379"),
            ("FLOODGATE_REDIS_POOL_SIZE", "3"),
            ("FLOODGATE_REDIS_KEY_PREFIX", "rl:"),
            ("FLOODGATE_REDIS_COMMAND_TIMEOUT_MS", "25"),
            ("FLOODGATE_REDIS_PER_SECOND__URL", "redis://second:6379"),
        ]
        .map(|(name, value)| (name.to_owned(), value.to_owned()));
        let settings =
            crate::settings::Settings::load_from(None, env, Default::default()).expect("loads");
        let main = RedisOptions::from_settings(&settings.redis, None);
        assert_eq!(
            (main.url.as_str(), main.pool_size),
            ("redis://main:6379", 3)
        );
        let second = RedisOptions::per_second_from_settings(&settings.redis, None);
        assert_eq!(second.url, "redis://second:6379");
        assert_eq!(
            second.pool_size, 3,
            "the main pool size unless it has its own"
        );
        assert_eq!(second.key_prefix, "rl:");
        assert_eq!(second.command_timeout, Duration::from_millis(25));
    }
}
