//! Counters a remote backend reported exhausted, remembered until their quota comes back, so
//! that hot over-limit keys — the ones an abusive client hammers — cost no Redis call.
//!
//! Only exhausted counters are remembered (remaining 0 after a rejection): until the next
//! unit of quota returns, every hit that costs something would be rejected, so the local
//! answer is the one Redis would give. What this replica cannot see: another replica's
//! give-back (`is_negative_hits`) returning quota early; a give-back through this replica
//! forgets the entry. The cache is bounded: when full, a new entry takes the place of the one
//! that expires first among a few picked at random (`bounded.rs`), in constant time.

use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use foldhash::fast::RandomState;
use indexmap::IndexMap;

use super::bounded::make_room;
use crate::clock::Clock;
use crate::limiter::{CounterKey, Decision, Hits};

const SHARDS: usize = 16;

type Entries = IndexMap<CounterKey, u64, RandomState>;

/// Exhausted counters and when each gets quota back (µs since the epoch).
pub struct OverLimitCache {
    shards: Box<[Mutex<Entries>]>,
    hasher: RandomState,
    capacity_per_shard: usize,
    clock: Arc<dyn Clock>,
}

impl OverLimitCache {
    /// A cache of at most `capacity` counters (0 disables it).
    pub fn new(capacity: usize, clock: Arc<dyn Clock>) -> Self {
        OverLimitCache {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(IndexMap::with_hasher(RandomState::default())))
                .collect(),
            hasher: RandomState::default(),
            capacity_per_shard: capacity.div_ceil(SHARDS),
            clock,
        }
    }

    /// The answer for `hits` on `key` if the key is known to be exhausted: a rejection with
    /// the time until its quota returns. Checks and give-backs always go to the backend.
    pub fn answer(&self, key: &CounterKey, hits: Hits) -> Option<Decision> {
        if self.capacity_per_shard == 0 {
            return None;
        }
        let mut shard = self.shard(key);
        if hits.negative {
            shard.swap_remove(key);
            return None;
        }
        if hits.amount == 0 {
            return None;
        }
        let until = *shard.get(key)?;
        let now = self.clock.now_micros();
        if until <= now {
            shard.swap_remove(key);
            return None;
        }
        Some(Decision {
            allowed: false,
            remaining: 0,
            reset_micros: until - now,
        })
    }

    /// Remembers `key` when the backend's `decision` says it is exhausted.
    pub fn observe(&self, key: &CounterKey, decision: &Decision) {
        if self.capacity_per_shard == 0
            || decision.allowed
            || decision.remaining > 0
            || decision.reset_micros == 0
        {
            return;
        }
        let now = self.clock.now_micros();
        let until = now.saturating_add(decision.reset_micros);
        let mut shard = self.shard(key);
        if let Some(known) = shard.get_mut(key) {
            *known = until;
            return;
        }
        make_room(&mut shard, self.capacity_per_shard, now, |until| *until);
        shard.insert(key.clone(), until);
    }

    /// Forgets `key` (its counter was reset).
    pub fn forget(&self, key: &CounterKey) {
        self.shard(key).swap_remove(key);
    }

    /// Forgets every counter: after a rule reload a limit may have been raised, and a counter
    /// remembered as exhausted under the old limit may have quota under the new one.
    pub fn clear(&self) {
        for shard in &self.shards {
            lock(shard).clear();
        }
    }

    /// How many counters are remembered.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|shard| lock(shard).len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard(&self, key: &CounterKey) -> MutexGuard<'_, Entries> {
        let index = usize::try_from(self.hasher.hash_one(key)).unwrap_or(0) % SHARDS;
        lock(&self.shards[index])
    }
}

/// The map holds plain data; a panic elsewhere while it was locked leaves it usable.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::limiter::{Limit, Unit};

    fn key(name: &str) -> CounterKey {
        CounterKey::new("d", "d.k", 0, &Limit::per(1, Unit::Second), [("k", name)])
    }

    fn exhausted(reset_micros: u64) -> Decision {
        Decision {
            allowed: false,
            remaining: 0,
            reset_micros,
        }
    }

    fn cache(capacity: usize) -> (Arc<ManualClock>, OverLimitCache) {
        let clock = Arc::new(ManualClock::new(1_000_000));
        (clock.clone(), OverLimitCache::new(capacity, clock))
    }

    #[test]
    fn an_exhausted_counter_is_rejected_locally_until_its_quota_returns() {
        let (clock, cache) = cache(100);
        cache.observe(&key("a"), &exhausted(500));
        assert_eq!(cache.answer(&key("a"), Hits::take(1)), Some(exhausted(500)));
        clock.advance(200);
        assert_eq!(cache.answer(&key("a"), Hits::take(1)), Some(exhausted(300)));
        clock.advance(300);
        assert_eq!(cache.answer(&key("a"), Hits::take(1)), None);
        assert!(cache.is_empty());
    }

    #[test]
    fn a_rejection_with_quota_left_is_not_remembered() {
        let (_, cache) = cache(100);
        let expensive = Decision {
            allowed: false,
            remaining: 3,
            reset_micros: 500,
        };
        cache.observe(&key("a"), &expensive);
        assert_eq!(cache.answer(&key("a"), Hits::take(1)), None);
    }

    #[test]
    fn checks_go_to_the_backend_and_give_backs_forget_the_entry() {
        let (_, cache) = cache(100);
        cache.observe(&key("a"), &exhausted(500));
        assert_eq!(cache.answer(&key("a"), Hits::take(0)), None);
        assert_eq!(cache.answer(&key("a"), Hits::give_back(1)), None);
        assert_eq!(cache.answer(&key("a"), Hits::take(1)), None);
    }

    #[test]
    fn a_full_cache_takes_each_new_key_in_place_of_another() {
        let (_, cache) = cache(SHARDS);
        for i in 0..10 * SHARDS {
            let key = key(&i.to_string());
            cache.observe(&key, &exhausted(100));
            assert!(
                cache.answer(&key, Hits::take(1)).is_some(),
                "the newest is kept"
            );
        }
        assert!(cache.len() <= SHARDS, "{}", cache.len());
    }

    #[test]
    fn clear_forgets_every_exhausted_counter() {
        let (_, cache) = cache(100);
        cache.observe(&key("a"), &exhausted(500));
        cache.observe(&key("b"), &exhausted(500));
        cache.clear();
        assert!(cache.is_empty());
        assert_eq!(cache.answer(&key("a"), Hits::take(1)), None);
    }

    #[test]
    fn capacity_zero_disables_the_cache() {
        let (_, cache) = cache(0);
        cache.observe(&key("a"), &exhausted(500));
        assert_eq!(cache.answer(&key("a"), Hits::take(1)), None);
    }
}
