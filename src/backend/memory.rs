//! STUB — to be replaced: the embedded, sharded, in-process counter store.
use std::sync::Arc;

use crate::clock::Clock;
use crate::limiter::{CounterKey, Decision, Hits, Limit};

/// Counters in process memory: sharded, exact under concurrency, idle counters expire.
pub struct MemoryBackend {
    clock: Arc<dyn Clock>,
}

impl MemoryBackend {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        MemoryBackend { clock }
    }

    /// Applies one hit to the counter `key` and answers it.
    pub fn hit(&self, _key: &CounterKey, _limit: &Limit, _hits: Hits) -> Decision {
        let _ = self.clock.now_micros();
        todo!()
    }

    /// Drops every counter whose state has expired; returns how many.
    pub fn remove_expired(&self) -> usize {
        todo!()
    }

    /// How many counters are held.
    pub fn len(&self) -> usize {
        todo!()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
