//! Counters in Redis: one Lua script call per counter, every call of a request in one
//! pipeline on one connection, so a request costs one round trip whatever its number of
//! descriptors. With `consume_on_reject = false` a request with several hits is instead one
//! call of the all-or-nothing script, which applies them all or none.
//!
//! Connections: a [`connect::Source`] opens them (a deadpool-redis pool for one address, or
//! the sentinels' current primary); the backend keeps a few for good and hands them out
//! round-robin. Each is a multiplexed connection, shared by every request in flight on it
//! (their pipelines interleave on one socket), so a request never waits for a checkout —
//! deadpool's recycle check costs a round trip of its own (UNWATCH + PING) on every
//! checkout, which measured as three Redis commands per decision instead of one. A connection that breaks, or whose server turned replica
//! (READONLY), is dropped and replaced from the source.
//!
//! Scripts are loaded once (SCRIPT LOAD) and called by EVALSHA. A server that lost them
//! (restart, failover, SCRIPT FLUSH) answers NOSCRIPT for exactly the calls it did not run;
//! those calls alone are sent again after a reload, so nothing is counted twice. Every wait
//! — for a pooled connection, for a new connection, for the pipeline's replies — is bounded
//! by the command timeout, so a dead Redis answers in bounded time instead of piling
//! requests up.

mod cluster;
mod connect;
pub mod script;

pub use cluster::RedisClusterBackend;
pub use connect::{Password, redact};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use deadpool_redis::redis;

use crate::backend::{BackendError, CounterHit, OnReject};
use crate::clock::Clock;
use crate::limiter::Decision;
use connect::{PrimaryConnection, Source};
pub(crate) use script::{ScriptClock, Scripts};

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
}

impl RedisOptions {
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

/// One standalone Redis server: a primary behind a single address, or the primary that
/// Redis Sentinel names.
pub struct RedisBackend {
    /// Where new connections come from.
    source: Source,
    /// `pool_size` long-lived multiplexed connections, filled from `source` on demand.
    connections: Box<[Mutex<Option<PrimaryConnection>>]>,
    next: AtomicUsize,
    scripts: Scripts,
    options: RedisOptions,
    /// This process's clock: only for calendar window boundaries; decisions use Redis time.
    clock: Arc<dyn Clock>,
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
        Ok(RedisBackend {
            source,
            connections: (0..options.pool_size.max(1))
                .map(|_| Mutex::new(None))
                .collect(),
            next: AtomicUsize::new(0),
            scripts: Scripts::new(),
            options,
            clock,
        })
    }

    /// Applies every hit, in order, within the command timeout.
    pub async fn hit_all(&self, hits: &[CounterHit<'_>]) -> Vec<Result<Decision, BackendError>> {
        self.bounded(hits, OnReject::Consume).await
    }

    /// Applies every hit, in order, only if no binding hit is rejected: one script call, so
    /// Redis decides the whole request at once and no other client sees it half applied.
    pub async fn hit_all_or_nothing(
        &self,
        hits: &[CounterHit<'_>],
    ) -> Vec<Result<Decision, BackendError>> {
        self.bounded(hits, OnReject::ConsumeNothing).await
    }

    /// One exchange for `hits` within the command timeout.
    async fn bounded(
        &self,
        hits: &[CounterHit<'_>],
        on_reject: OnReject,
    ) -> Vec<Result<Decision, BackendError>> {
        if hits.is_empty() {
            return Vec::new();
        }
        let timeout = self.options.command_timeout;
        match tokio::time::timeout(timeout, self.exchange(hits, on_reject)).await {
            Ok(Ok(results)) => results,
            Ok(Err(error)) => vec![Err(error); hits.len()],
            Err(_) => vec![Err(BackendError::Timeout(timeout)); hits.len()],
        }
    }

    /// Loads every script on the server (once at start-up; NOSCRIPT reloads them too).
    pub async fn load_scripts(&self) -> Result<(), BackendError> {
        let (slot, mut connection) = self.connection().await?;
        let result = load_scripts(&mut connection, &self.scripts).await;
        if result.is_err() {
            *lock(&self.connections[slot]) = None;
        }
        result
    }

    /// The next connection, round-robin; an empty slot is filled from the source.
    async fn connection(&self) -> Result<(usize, PrimaryConnection), BackendError> {
        let slot = self.next.fetch_add(1, Ordering::Relaxed) % self.connections.len();
        if let Some(connection) = lock(&self.connections[slot]).clone() {
            return Ok((slot, connection));
        }
        let connection = self.source.connect().await?;
        *lock(&self.connections[slot]) = Some(connection.clone());
        Ok((slot, connection))
    }

    async fn exchange(
        &self,
        hits: &[CounterHit<'_>],
        on_reject: OnReject,
    ) -> Result<Vec<Result<Decision, BackendError>>, BackendError> {
        let (slot, mut connection) = self.connection().await?;
        let calls: Vec<Call<'_>> = hits
            .iter()
            .map(|hit| Call::new(&self.options.key_prefix, hit))
            .collect();
        let now = self.clock.now_micros();
        let result = match on_reject {
            OnReject::Consume => run_calls(&mut connection, &self.scripts, &calls, now).await,
            OnReject::ConsumeNothing => {
                run_all_or_nothing(&mut connection, &self.scripts, &calls, now).await
            }
        };
        if result.is_err() {
            // Possibly a dead socket: the next request on this slot gets a fresh connection.
            *lock(&self.connections[slot]) = None;
        }
        result
    }
}

/// One counter hit as a script call: the full Redis key and the hit.
pub(crate) struct Call<'a> {
    pub key: String,
    pub hit: &'a CounterHit<'a>,
}

impl<'a> Call<'a> {
    pub fn new(prefix: &str, hit: &'a CounterHit<'a>) -> Self {
        Call {
            key: format!("{prefix}{}", hit.key),
            hit,
        }
    }
}

/// Runs `calls` on one connection as one script call, each hit decided on its own; then,
/// if the server had lost the script, loads it and sends the call once more (a NOSCRIPT
/// reply means nothing ran, so nothing is counted twice). `local_now` is this process's
/// clock, for calendar window boundaries only.
pub(crate) async fn run_calls<C: redis::aio::ConnectionLike>(
    connection: &mut C,
    scripts: &Scripts,
    calls: &[Call<'_>],
    local_now: u64,
) -> Result<Vec<Result<Decision, BackendError>>, BackendError> {
    run_group(connection, scripts, calls, script::Mode::Each, local_now).await
}

/// Runs `calls` as one all-or-nothing group (loading the script and sending it once more
/// if the server had lost it). A failed group fails every call: it ran entirely or not at
/// all.
async fn run_all_or_nothing<C: redis::aio::ConnectionLike>(
    connection: &mut C,
    scripts: &Scripts,
    calls: &[Call<'_>],
    local_now: u64,
) -> Result<Vec<Result<Decision, BackendError>>, BackendError> {
    run_group(
        connection,
        scripts,
        calls,
        script::Mode::AllOrNothing,
        local_now,
    )
    .await
}

async fn run_group<C: redis::aio::ConnectionLike>(
    connection: &mut C,
    scripts: &Scripts,
    calls: &[Call<'_>],
    mode: script::Mode,
    local_now: u64,
) -> Result<Vec<Result<Decision, BackendError>>, BackendError> {
    let planned: Vec<script::PlannedHit<'_>> = calls
        .iter()
        .map(|call| script::PlannedHit {
            key: &call.key,
            limit: &call.hit.limit,
            hits: call.hit.hits,
            binding: call.hit.binding,
        })
        .collect();
    let groups = [script::Group {
        mode,
        hits: &planned,
    }];
    let command = script::batch_call(
        scripts,
        &groups,
        script::Declare::Nothing,
        ScriptClock::Redis,
        local_now,
    );
    let mut reply = query_one(connection, &command).await?;
    if is_noscript(&reply) {
        tracing::info!("redis lost its script; loading it again");
        load_scripts(connection, scripts).await?;
        reply = query_one(connection, &command).await?;
    }
    Ok(batch_results(&reply, &groups))
}

/// Each hit's result from a batch call's reply: its decision, or why it has none.
pub(crate) fn batch_results(
    reply: &redis::Value,
    groups: &[script::Group<'_>],
) -> Vec<Result<Decision, BackendError>> {
    let hits = groups.iter().map(|group| group.hits.len()).sum();
    match script::batch_reply(reply, groups) {
        Ok(read) => (read.decisions.into_iter())
            .map(|decision| decision.map_err(|e| BackendError::Unavailable(format!("redis: {e}"))))
            .collect(),
        Err(error) if matches!(reply, redis::Value::ServerError(_)) => {
            vec![Err(BackendError::Unavailable(error)); hits]
        }
        Err(error) => vec![Err(BackendError::Protocol(error)); hits],
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

/// A slot holds a handle only; a panic elsewhere while it was locked leaves it usable.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn is_noscript(reply: &redis::Value) -> bool {
    matches!(reply, redis::Value::ServerError(error)
        if error.kind() == Some(redis::ServerErrorKind::NoScript))
}

/// The result of a call of one hit ([`script::add_call`]).
fn reply_to_result(reply: &redis::Value) -> Result<Decision, BackendError> {
    match reply {
        redis::Value::ServerError(error) => {
            Err(BackendError::Unavailable(format!("redis: {error}")))
        }
        redis::Value::Array(items) if items.len() > 3 => {
            // An error of the hit itself: its message follows the three numbers.
            let message = script::decision(reply).err().unwrap_or_default();
            Err(BackendError::Unavailable(format!("redis: {message}")))
        }
        reply => script::decision(reply).map_err(BackendError::Protocol),
    }
}

fn unavailable(error: redis::RedisError) -> BackendError {
    BackendError::Unavailable(format!("redis: {error}"))
}
