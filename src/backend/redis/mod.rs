//! Counters in Redis: every counter hit is decided inside Redis by floodgate's Lua script,
//! and one script call decides the hits of many requests at once.
//!
//! The rooms: `standalone.rs` (one server, or Sentinel's primary) and `cluster.rs` (a Redis
//! Cluster, with `slots.rs` and its rooms in `cluster/`) are the backends; `batcher.rs` is a
//! connection's queue, `script/` the Lua call (`call.rs`) and its reply (`reply.rs`),
//! `connect.rs` where connections come from, `deadline.rs` Redis' clock, `capacity.rs` how
//! much work a connection admits (with `recent.rs`, the least of recent samples). Both
//! backends are a [`RemoteStore`](crate::backend::RemoteStore). This file holds what they
//! share: the options and a few helpers.
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
mod capacity;
mod cluster;
mod connect;
mod deadline;
mod recent;
pub mod script;
pub mod slots;
mod standalone;

pub use cluster::RedisClusterBackend;
pub use connect::{RedisTls, redact};
pub use standalone::RedisBackend;

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use deadpool_redis::redis;
use tokio::time::Instant;

use crate::backend::{BackendError, CounterHit};
use crate::limiter::{CounterKey, Limit};
use crate::settings::{Password, RedisSettings};
use script::RedisHit;
pub(crate) use script::Scripts;

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
    /// The most a request waits for Redis, whatever its caller's deadline
    /// (`redis_max_wait_ms`).
    pub max_wait: Duration,
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
            max_wait: settings.max_wait(),
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
        let mut key = String::with_capacity(self.key_prefix.len() + hit.key.as_str().len());
        key.push_str(&self.key_prefix);
        key.push_str(hit.key.as_str());
        RedisHit {
            key,
            limit: hit.limit.clone().into_owned(),
            hits: hit.hits,
            binding: hit.binding,
        }
    }

    /// The prefix goes before the counter key's `{…}` hash tag, which must stay the first
    /// brace pair in the key for Redis Cluster to hash the right part.
    /// The full Redis keys of `counters` (the key prefix, then the counter key), each with
    /// its limit.
    fn full_keys(&self, counters: &[(CounterKey, Limit)]) -> Vec<(String, Limit)> {
        (counters.iter())
            .map(|(key, limit)| (format!("{}{key}", self.key_prefix), limit.clone()))
            .collect()
    }

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
/// The URLs of a comma-separated list (cluster seeds, sentinels), blanks around them ignored.
fn seeds(urls: &str) -> Result<Vec<&str>, BackendError> {
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

fn usable(password: &Option<Password>) -> Option<Password> {
    password
        .clone()
        .filter(|password| !password.expose().is_empty())
}

/// When a request must be answered: the caller's deadline, or `command_timeout` from now
/// when it gave none. (Each call to Redis is bounded by the command timeout besides.)
pub(crate) fn request_deadline(caller: Option<Instant>, command_timeout: Duration) -> Instant {
    caller.unwrap_or_else(|| Instant::now() + command_timeout)
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
