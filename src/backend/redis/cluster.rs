//! STUB — to be replaced: counters in a Redis Cluster.

use std::sync::Arc;

use crate::backend::{BackendError, CounterHit};
use crate::clock::Clock;
use crate::limiter::Decision;

use super::RedisOptions;

/// A Redis Cluster reached through a list of seed nodes.
pub struct RedisClusterBackend {
    _clock: Arc<dyn Clock>,
}

impl RedisClusterBackend {
    /// `options.url` is a comma-separated list of seed node URLs.
    pub fn new(_options: RedisOptions, clock: Arc<dyn Clock>) -> Result<Self, BackendError> {
        Ok(RedisClusterBackend { _clock: clock })
    }

    /// Applies every hit, in order, within the command timeout.
    pub async fn hit_all(&self, hits: &[CounterHit<'_>]) -> Vec<Result<Decision, BackendError>> {
        vec![
            Err(BackendError::Config(
                "redis-cluster is not built yet".into()
            ));
            hits.len()
        ]
    }

    /// Loads every script on every primary.
    pub async fn load_scripts(&self) -> Result<(), BackendError> {
        Err(BackendError::Config(
            "redis-cluster is not built yet".into(),
        ))
    }
}
