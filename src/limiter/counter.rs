//! STUB — to be replaced: one counter's state on the memory backend.
use super::{Decision, Hits, Limit};

/// One counter's state, for whichever algorithm its limit uses. A new counter is one that
/// was never hit.
#[derive(Debug, Clone, Default)]
pub struct Counter {}

impl Counter {
    pub fn new() -> Self {
        Counter {}
    }

    /// Applies one hit at `now_micros` and answers it.
    pub fn hit(&mut self, _limit: &Limit, _now_micros: u64, _hits: Hits) -> Decision {
        todo!()
    }

    /// After this instant the state is equivalent to `Counter::new()` and can be dropped.
    pub fn expires_at(&self) -> u64 {
        todo!()
    }
}
