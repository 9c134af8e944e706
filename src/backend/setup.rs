//! The backend the settings name: the memory counters, or a Redis store behind its breaker and
//! over-limit cache (with a second one for per-second limits when `redis_per_second` names
//! one), and the start-up wait for Redis (`redis_startup`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::breaker::BreakerSettings;
use super::redis::{RedisBackend, RedisClusterBackend, RedisOptions, RedisTls};
use super::{Backend, BackendError, MemoryBackend, OverLimitCache, RemoteStore};
use crate::clock::Clock;
use crate::files;
use crate::settings::{BackendKind, RedisSettings, RedisStartup, Settings};

impl Backend {
    /// The counter store `settings` name: `memory` itself, or a Redis store behind its
    /// breaker and over-limit cache; with `redis_per_second.backend`, a second one for
    /// per-second limits. A Redis that is down at start is every rule's failure policy later,
    /// not a reason to refuse to start (its breaker starts open), unless
    /// `redis_startup.max_elapsed_ms` asks the start to wait for it.
    pub async fn from_settings(
        settings: &Settings,
        clock: Arc<dyn Clock>,
        memory: &Arc<MemoryBackend>,
    ) -> Result<Backend, BackendError> {
        let redis = &settings.redis;
        let tls = redis_tls(redis)?;
        let breakers = BreakerSettings {
            failures: redis.breaker_failures,
            window: Duration::from_millis(redis.breaker_window_ms),
            cooldown: Duration::from_millis(redis.breaker_cooldown_ms),
        };
        // A store that did not answer at start starts with its breaker open: requests get
        // their policy at once, and readiness that follows the backend waits for its answer.
        let remote = |(store, down): (Arc<dyn RemoteStore>, Option<BackendError>)| {
            // A cluster keeps a breaker per primary: one primary's failures are its own.
            let breaker = (!store.own_breakers()).then(|| breakers.build(clock.clone(), None));
            let over_limit = OverLimitCache::new(redis.local_cache_size, clock.clone());
            let backend = Backend::remote(store, breaker, over_limit);
            if let Some(error) = down {
                backend.open_at_start(&error.to_string());
            }
            backend
        };
        let main = RedisOptions::from_settings(redis, tls.clone());
        let backend = match settings.backend {
            BackendKind::Memory => Backend::memory(memory.clone()),
            #[cfg(test)]
            BackendKind::Scripted => {
                let store = super::scripted::ScriptedStore::from_settings(&settings.scripted);
                remote((Arc::new(store), None))
            }
            kind => {
                remote(redis_store("redis", kind, main, &clock, breakers, &redis.startup).await?)
            }
        };
        let Some(kind) = redis.per_second.backend else {
            return Ok(backend);
        };
        if settings.backend == BackendKind::Memory {
            return Err(BackendError::Config(
                "redis_per_second needs a Redis backend: the memory backend holds every counter"
                    .into(),
            ));
        }
        let options = RedisOptions::per_second_from_settings(redis, tls);
        let store = redis_store(
            "redis_per_second",
            kind,
            options,
            &clock,
            breakers,
            &redis.startup,
        )
        .await?;
        Ok(backend.with_per_second(remote(store)))
    }
}

/// A Redis store of `kind`, its scripts loaded when it answers; `role` names it in the log
/// and errors (`redis`, or `redis_per_second`). With `redis_startup.max_elapsed_ms`, the
/// start waits for it that long at most; without, the error of a store that did not answer
/// comes with it.
async fn redis_store(
    role: &'static str,
    kind: BackendKind,
    options: RedisOptions,
    clock: &Arc<dyn Clock>,
    breakers: BreakerSettings,
    startup: &RedisStartup,
) -> Result<(Arc<dyn RemoteStore>, Option<BackendError>), BackendError> {
    let in_role = |error: BackendError| match error {
        BackendError::Config(why) => BackendError::Config(format!("{role}: {why}")),
        other => other,
    };
    let store: Arc<dyn RemoteStore> = match kind {
        BackendKind::Redis => Arc::new(RedisBackend::new(options, clock.clone()).map_err(in_role)?),
        BackendKind::RedisSentinel => {
            Arc::new(RedisBackend::sentinel(options, clock.clone()).map_err(in_role)?)
        }
        BackendKind::RedisCluster => {
            Arc::new(RedisClusterBackend::new(options, clock.clone(), breakers).map_err(in_role)?)
        }
        other => {
            let why = format!("{} is not a Redis", other.name());
            return Err(in_role(BackendError::Config(why)));
        }
    };
    let Err(error) = store.prepare().await else {
        return Ok((store, None));
    };
    if startup.max_elapsed_ms == 0 {
        tracing::warn!(store = role, %error, "could not connect to redis and load the scripts yet");
        return Ok((store, Some(error)));
    }
    // Upstream's start-up retries: wait for Redis, or fail the start for the orchestrator to
    // see.
    let started = tokio::time::Instant::now();
    let longest = Duration::from_millis(startup.max_elapsed_ms);
    let mut pause = Duration::from_millis(startup.initial_interval_ms);
    let mut last = error;
    for tries in 1.. {
        if started.elapsed() + pause > longest {
            return Err(BackendError::NothingCounted(format!(
                "{role}: Redis did not answer within redis_startup.max_elapsed_ms ({} ms, \
                 {tries} tries): {last}",
                startup.max_elapsed_ms
            )));
        }
        let retry_in_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX);
        tracing::warn!(store = role, error = %last, retry_in_ms, "redis does not answer at start-up; trying again");
        tokio::time::sleep(pause).await;
        match store.prepare().await {
            Ok(()) => {
                // At the level of the failures it follows, so a log that shows them shows this.
                tracing::warn!(
                    store = role,
                    tries = tries + 1,
                    "redis answered at start-up"
                );
                break;
            }
            Err(error) => last = error,
        }
        pause = (pause * 2).min(Duration::from_millis(startup.max_interval_ms));
    }
    Ok((store, None))
}

/// The Redis TLS files the settings name, read; `None` when they name none.
fn redis_tls(settings: &RedisSettings) -> Result<Option<RedisTls>, BackendError> {
    let read = |path: &Option<PathBuf>| {
        let read = |path| files::read(path, files::PEM_MAX_BYTES);
        (path.as_deref().map(read).transpose()).map_err(|e| BackendError::Config(e.to_string()))
    };
    let ca = read(&settings.tls_ca_file)?;
    let client = match (
        read(&settings.tls_cert_file)?,
        read(&settings.tls_key_file)?,
    ) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => {
            return Err(BackendError::Config(
                "redis_tls_cert_file and redis_tls_key_file go together".into(),
            ));
        }
    };
    Ok((ca.is_some() || client.is_some()).then_some(RedisTls { ca, client }))
}
