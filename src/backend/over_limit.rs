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

use super::bounded::{Room, make_room};
use crate::clock::Clock;
use crate::limiter::{CounterKey, Decision, Hits};

const SHARDS: usize = 16;

type Entries = IndexMap<CounterKey, Entry, RandomState>;

/// An exhausted counter: when it gets quota back (µs since the epoch), and when it was last
/// stored or answered (seconds since the epoch).
#[derive(Debug, Clone, Copy)]
struct Entry {
    until: u64,
    accessed: u32,
}

/// Exhausted counters and when each gets quota back.
pub struct OverLimitCache {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    capacity_per_shard: usize,
    clock: Arc<dyn Clock>,
}

/// One shard: its entries, and what it did since start, counted under the lock a request
/// already holds (no counter shared by every request).
#[derive(Default)]
struct Shard {
    entries: Entries,
    counts: Counts,
}

/// What a shard did since start, as envoyproxy/ratelimit's local cache (freecache) counts
/// it: each is one of its `ratelimit.localcache.*` gauges.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    lookups: u64,
    hits: u64,
    expired: u64,
    evacuated: u64,
    overwrites: u64,
}

/// The cache's counts at one moment ([`OverLimitCache::counts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheCounts {
    /// Hits that looked for their counter (a check or a give-back does not).
    pub lookups: u64,
    /// Lookups answered from the cache; the others are misses.
    pub hits: u64,
    pub misses: u64,
    /// Entries held now.
    pub entries: u64,
    /// Entries dropped because their quota had returned.
    pub expired: u64,
    /// Entries still exhausted pushed out to make room for new ones.
    pub evacuated: u64,
    /// Rejections remembered again for a counter already held.
    pub overwrites: u64,
    /// The mean of the moments (seconds since the epoch) the entries held were last
    /// stored or answered; 0 when empty.
    pub average_access_time: u64,
}

impl std::ops::Add for CacheCounts {
    type Output = CacheCounts;

    fn add(self, other: CacheCounts) -> CacheCounts {
        let entries = self.entries + other.entries;
        let weighted = |counts: &CacheCounts| {
            u128::from(counts.average_access_time) * u128::from(counts.entries)
        };
        let average = (weighted(&self) + weighted(&other))
            .checked_div(u128::from(entries))
            .unwrap_or(0);
        CacheCounts {
            lookups: self.lookups + other.lookups,
            hits: self.hits + other.hits,
            misses: self.misses + other.misses,
            entries,
            expired: self.expired + other.expired,
            evacuated: self.evacuated + other.evacuated,
            overwrites: self.overwrites + other.overwrites,
            average_access_time: u64::try_from(average).unwrap_or(u64::MAX),
        }
    }
}

impl OverLimitCache {
    /// A cache of at most `capacity` counters (0 disables it).
    pub fn new(capacity: usize, clock: Arc<dyn Clock>) -> Self {
        OverLimitCache {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::default(),
            capacity_per_shard: capacity.div_ceil(SHARDS),
            clock,
        }
    }

    /// Whether the cache remembers anything at all (its capacity is not 0).
    pub fn enabled(&self) -> bool {
        self.capacity_per_shard > 0
    }

    /// The answer for `hits` on `key` if the key is known to be exhausted: a rejection with
    /// the time until its quota returns. Checks and give-backs always go to the backend.
    pub fn answer(&self, key: &CounterKey, hits: Hits) -> Option<Decision> {
        if self.capacity_per_shard == 0 {
            return None;
        }
        let mut guard = self.shard(key);
        let Shard { entries, counts } = &mut *guard;
        if hits.negative {
            entries.swap_remove(key);
            return None;
        }
        if hits.amount == 0 {
            return None;
        }
        counts.lookups += 1;
        let entry = entries.get_mut(key)?;
        let now = self.clock.now_micros();
        if entry.until <= now {
            entries.swap_remove(key);
            counts.expired += 1;
            return None;
        }
        entry.accessed = seconds(now);
        counts.hits += 1;
        Some(Decision {
            allowed: false,
            remaining: 0,
            reset_micros: entry.until - now,
        })
    }

    /// The cache's clock (µs since the epoch): when a backend call starts, for
    /// [`OverLimitCache::observe`].
    pub fn now_micros(&self) -> u64 {
        self.clock.now_micros()
    }

    /// Remembers `key` when the backend's `decision`, to a call sent at `asked` (µs since
    /// the epoch), says it is exhausted. The time left is counted from `asked`: the backend
    /// measured it later, so the entry ends at the latest when the backend's window does,
    /// never a round trip after it.
    pub fn observe(&self, key: &CounterKey, decision: &Decision, asked: u64) {
        if self.capacity_per_shard == 0
            || decision.allowed
            || decision.remaining > 0
            || decision.reset_micros == 0
        {
            return;
        }
        let now = self.clock.now_micros();
        let until = asked.min(now).saturating_add(decision.reset_micros);
        let entry = Entry {
            until,
            accessed: seconds(now),
        };
        let mut guard = self.shard(key);
        let Shard { entries, counts } = &mut *guard;
        if let Some(known) = entries.get_mut(key) {
            *known = entry;
            counts.overwrites += 1;
            return;
        }
        match make_room(entries, self.capacity_per_shard, now, |e| e.until) {
            Room::Free => {}
            Room::Expired => counts.expired += 1,
            Room::Evicted => counts.evacuated += 1,
        }
        entries.insert(key.clone(), entry);
    }

    /// Forgets `key` (its counter was reset).
    pub fn forget(&self, key: &CounterKey) {
        self.shard(key).entries.swap_remove(key);
    }

    /// Forgets every counter: after a rule reload a limit may have been raised, and a counter
    /// remembered as exhausted under the old limit may have quota under the new one.
    pub fn clear(&self) {
        for shard in &self.shards {
            lock(shard).entries.clear();
        }
    }

    /// How many counters are remembered.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| lock(shard).entries.len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What the cache did since start, and holds now (each shard read in turn: for a
    /// periodic report, not the request path).
    pub fn counts(&self) -> CacheCounts {
        let (mut entries, mut accessed) = (0u64, 0u128);
        let mut total = Counts::default();
        for shard in &self.shards {
            let shard = lock(shard);
            entries += shard.entries.len() as u64;
            accessed += (shard.entries.values())
                .map(|e| u128::from(e.accessed))
                .sum::<u128>();
            let counts = shard.counts;
            total.lookups += counts.lookups;
            total.hits += counts.hits;
            total.expired += counts.expired;
            total.evacuated += counts.evacuated;
            total.overwrites += counts.overwrites;
        }
        let average = accessed.checked_div(u128::from(entries)).unwrap_or(0);
        CacheCounts {
            lookups: total.lookups,
            hits: total.hits,
            misses: total.lookups.saturating_sub(total.hits),
            entries,
            expired: total.expired,
            evacuated: total.evacuated,
            overwrites: total.overwrites,
            average_access_time: u64::try_from(average).unwrap_or(u64::MAX),
        }
    }

    fn shard(&self, key: &CounterKey) -> MutexGuard<'_, Shard> {
        let index = usize::try_from(self.hasher.hash_one(key)).unwrap_or(0) % SHARDS;
        lock(&self.shards[index])
    }
}

/// Whole seconds of `micros` (µs since the epoch), as an entry keeps them.
fn seconds(micros: u64) -> u32 {
    u32::try_from(micros / 1_000_000).unwrap_or(u32::MAX)
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
        cache.observe(&key("a"), &exhausted(500), cache.now_micros());
        assert_eq!(cache.answer(&key("a"), Hits::take(1)), Some(exhausted(500)));
        clock.advance(200);
        assert_eq!(cache.answer(&key("a"), Hits::take(1)), Some(exhausted(300)));
        clock.advance(300);
        assert_eq!(cache.answer(&key("a"), Hits::take(1)), None);
        assert!(cache.is_empty());
    }

    #[test]
    fn the_time_left_counts_from_when_the_call_was_sent() {
        let (clock, cache) = cache(100);
        let asked = cache.now_micros();
        clock.advance(8_000);
        cache.observe(&key("a"), &exhausted(500_000), asked);
        assert_eq!(
            cache.answer(&key("a"), Hits::take(1)),
            Some(exhausted(492_000)),
            "the 8 ms the answer took are part of the window, not added to it"
        );
        clock.advance(492_000);
        assert_eq!(
            cache.answer(&key("a"), Hits::take(1)),
            None,
            "ended with it"
        );
    }

    #[test]
    fn a_rejection_with_quota_left_is_not_remembered() {
        let (_, cache) = cache(100);
        let expensive = Decision {
            allowed: false,
            remaining: 3,
            reset_micros: 500,
        };
        cache.observe(&key("a"), &expensive, cache.now_micros());
        assert_eq!(cache.answer(&key("a"), Hits::take(1)), None);
    }

    #[test]
    fn checks_go_to_the_backend_and_give_backs_forget_the_entry() {
        let (_, cache) = cache(100);
        cache.observe(&key("a"), &exhausted(500), cache.now_micros());
        assert_eq!(cache.answer(&key("a"), Hits::take(0)), None);
        assert_eq!(cache.answer(&key("a"), Hits::give_back(1)), None);
        assert_eq!(cache.answer(&key("a"), Hits::take(1)), None);
    }

    #[test]
    fn a_full_cache_takes_each_new_key_in_place_of_another() {
        let (_, cache) = cache(SHARDS);
        for i in 0..10 * SHARDS {
            let key = key(&i.to_string());
            cache.observe(&key, &exhausted(100), cache.now_micros());
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
        cache.observe(&key("a"), &exhausted(500), cache.now_micros());
        cache.observe(&key("b"), &exhausted(500), cache.now_micros());
        cache.clear();
        assert!(cache.is_empty());
        assert_eq!(cache.answer(&key("a"), Hits::take(1)), None);
    }

    #[test]
    fn counts_follow_upstreams_local_cache_gauges() {
        let (clock, cache) = cache(SHARDS);
        cache.observe(&key("a"), &exhausted(500), cache.now_micros());
        cache.observe(&key("a"), &exhausted(500), cache.now_micros());
        assert!(cache.answer(&key("a"), Hits::take(1)).is_some());
        assert!(cache.answer(&key("b"), Hits::take(1)).is_none());
        assert!(
            cache.answer(&key("a"), Hits::take(0)).is_none(),
            "a check: no lookup"
        );
        clock.advance(500);
        assert!(cache.answer(&key("a"), Hits::take(1)).is_none(), "expired");
        for i in 0..10 * SHARDS {
            cache.observe(
                &key(&i.to_string()),
                &exhausted(1_000_000_000),
                cache.now_micros(),
            );
        }
        let counts = cache.counts();
        assert_eq!(
            (
                counts.lookups,
                counts.hits,
                counts.misses,
                counts.overwrites
            ),
            (3, 1, 2, 1)
        );
        assert_eq!(counts.expired, 1);
        assert_eq!(counts.entries, cache.len() as u64);
        assert_eq!(
            counts.evacuated,
            10 * SHARDS as u64 - counts.entries,
            "every entry pushed out was still exhausted"
        );
        assert_eq!(
            counts.average_access_time, 1,
            "stored at 1 s after the epoch"
        );
        let both = counts + CacheCounts::default();
        assert_eq!(both, counts, "adding an empty cache changes nothing");
    }

    #[test]
    fn capacity_zero_disables_the_cache() {
        let (_, cache) = cache(0);
        cache.observe(&key("a"), &exhausted(500), cache.now_micros());
        assert_eq!(cache.answer(&key("a"), Hits::take(1)), None);
    }
}
