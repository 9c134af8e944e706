//! Counters in Redis: one Lua script call per counter, every call of a request in one
//! pipeline on one pooled connection, so a request costs one round trip whatever its number
//! of descriptors.
//!
//! Scripts are loaded once (SCRIPT LOAD) and called by EVALSHA. A server that lost them
//! (restart, failover, SCRIPT FLUSH) answers NOSCRIPT for exactly the calls it did not run;
//! those calls alone are sent again after a reload, so nothing is counted twice. Every wait
//! — for a pooled connection, for a new connection, for the pipeline's replies — is bounded
//! by the command timeout, so a dead Redis answers in bounded time instead of piling
//! requests up.

pub mod script;

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::{Pool, Runtime, redis};

use crate::backend::{BackendError, CounterHit};
use crate::clock::Clock;
use crate::limiter::Decision;
use script::{ScriptClock, Scripts};

/// How to reach Redis and how long to wait for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisOptions {
    /// `redis://[user:password@]host:port[/db]`.
    pub url: String,
    pub pool_size: usize,
    /// Bound on opening a new connection.
    pub connect_timeout: Duration,
    /// Bound on one request's whole exchange with Redis (waiting for a connection included).
    pub command_timeout: Duration,
    /// Put before every key, so several deployments can share one Redis. Must not contain
    /// `{` or `}` (the counter key's hash tag must stay the first one).
    pub key_prefix: String,
}

/// One standalone Redis server (or a primary behind a single address).
pub struct RedisBackend {
    pool: Pool,
    scripts: Scripts,
    options: RedisOptions,
    /// This process's clock: only for calendar window boundaries; decisions use Redis time.
    clock: Arc<dyn Clock>,
}

impl RedisBackend {
    /// Builds the pool. No connection is made yet: a Redis that is down at start-up is a
    /// backend failure for the requests, handled by each rule's `on_backend_error`, not a
    /// reason to refuse to start.
    pub fn new(options: RedisOptions, clock: Arc<dyn Clock>) -> Result<Self, BackendError> {
        if options.key_prefix.contains(['{', '}']) {
            return Err(BackendError::Config(format!(
                "redis key prefix {:?} must not contain '{{' or '}}'",
                options.key_prefix
            )));
        }
        let pool = deadpool_redis::Config::from_url(options.url.clone())
            .builder()
            .map_err(|e| BackendError::Config(format!("redis url {:?}: {e}", options.url)))?
            .max_size(options.pool_size.max(1))
            .wait_timeout(Some(options.command_timeout))
            .create_timeout(Some(options.connect_timeout))
            .recycle_timeout(Some(options.command_timeout))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| BackendError::Config(format!("redis pool: {e}")))?;
        Ok(RedisBackend {
            pool,
            scripts: Scripts::new(),
            options,
            clock,
        })
    }

    /// Applies every hit, in order, within the command timeout.
    pub async fn hit_all(&self, hits: &[CounterHit<'_>]) -> Vec<Result<Decision, BackendError>> {
        if hits.is_empty() {
            return Vec::new();
        }
        let timeout = self.options.command_timeout;
        match tokio::time::timeout(timeout, self.exchange(hits)).await {
            Ok(Ok(results)) => results,
            Ok(Err(error)) => vec![Err(error); hits.len()],
            Err(_) => vec![Err(BackendError::Timeout(timeout)); hits.len()],
        }
    }

    /// Loads every script on the server (after a NOSCRIPT, and once at start-up).
    pub async fn load_scripts(&self) -> Result<(), BackendError> {
        let mut connection = self.connection().await?;
        self.load_scripts_on(&mut connection).await
    }

    async fn load_scripts_on(
        &self,
        connection: &mut deadpool_redis::Connection,
    ) -> Result<(), BackendError> {
        for script in self.scripts.all() {
            script.load_async(connection).await.map_err(unavailable)?;
        }
        Ok(())
    }

    async fn connection(&self) -> Result<deadpool_redis::Connection, BackendError> {
        self.pool
            .get()
            .await
            .map_err(|e| BackendError::Unavailable(format!("redis connection: {e}")))
    }

    /// One pipeline with every call; then, if the server had lost its scripts, a reload and
    /// one more pipeline with just the calls it refused.
    async fn exchange(
        &self,
        hits: &[CounterHit<'_>],
    ) -> Result<Vec<Result<Decision, BackendError>>, BackendError> {
        let mut connection = self.connection().await?;
        let now = self.clock.now_micros();
        let keys: Vec<String> = hits
            .iter()
            .map(|hit| format!("{}{}", self.options.key_prefix, hit.key))
            .collect();
        let send = |indices: &[usize]| {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for &i in indices {
                let hit = &hits[i];
                script::add_call(
                    &mut pipe,
                    &self.scripts,
                    &keys[i],
                    &hit.limit,
                    hit.hits,
                    ScriptClock::Redis,
                    now,
                );
            }
            pipe
        };

        let all: Vec<usize> = (0..hits.len()).collect();
        let replies: Vec<redis::Value> = send(&all)
            .query_async(&mut connection)
            .await
            .map_err(unavailable)?;
        let mut results: Vec<Result<Decision, BackendError>> =
            replies.iter().map(reply_to_result).collect();

        let refused: Vec<usize> = replies
            .iter()
            .enumerate()
            .filter(|(_, reply)| is_noscript(reply))
            .map(|(i, _)| i)
            .collect();
        if !refused.is_empty() {
            tracing::info!(
                calls = refused.len(),
                "redis lost its scripts; loading them again"
            );
            self.load_scripts_on(&mut connection).await?;
            let retried: Vec<redis::Value> = send(&refused)
                .query_async(&mut connection)
                .await
                .map_err(unavailable)?;
            for (i, reply) in refused.into_iter().zip(retried.iter()) {
                results[i] = reply_to_result(reply);
            }
        }
        Ok(results)
    }
}

fn is_noscript(reply: &redis::Value) -> bool {
    matches!(reply, redis::Value::ServerError(error)
        if error.kind() == Some(redis::ServerErrorKind::NoScript))
}

fn reply_to_result(reply: &redis::Value) -> Result<Decision, BackendError> {
    match reply {
        redis::Value::ServerError(error) => {
            Err(BackendError::Unavailable(format!("redis: {error}")))
        }
        reply => script::decision(reply).map_err(BackendError::Protocol),
    }
}

fn unavailable(error: redis::RedisError) -> BackendError {
    BackendError::Unavailable(format!("redis: {error}"))
}
