//! The embedded counter store: every counter in process memory, for a single instance.
//!
//! Counters are spread over a power-of-two number of shards, each a mutex around a hash map,
//! the shard chosen by hashing the key. A hit locks one shard for the one counter's math and
//! nothing else, so hits on different counters rarely wait on each other and hits on one
//! counter are serialized: exact under any concurrency. Idle counters expire, and a sweeper
//! removes them, so memory follows the number of recently active counters.
//!
//! The number of counters is bounded (`memory_max_counters`), so a client sending a new value
//! with every request cannot exhaust memory. Once a shard is full, a new counter takes the
//! place of the one that expires first among a few picked at random (`bounded.rs`): an
//! expired one when there is any, else a live one, which then starts over if it is hit again
//! (an eviction, counted). In constant time, however many counters there are.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use foldhash::fast::RandomState;
use indexmap::IndexMap;

use super::bounded::{Room, make_room};
use crate::backend::CounterHit;
use crate::clock::Clock;
use crate::limiter::{Counter, CounterKey, Decision, Hits, Limit};

type Counters = IndexMap<CounterKey, Counter, RandomState>;
type Shard = Mutex<Counters>;

/// Counters in process memory: sharded, exact under concurrency, idle counters expire.
pub struct MemoryBackend {
    clock: Arc<dyn Clock>,
    shards: Box<[Shard]>,
    /// Picks the shard. Seeded apart from the maps' own hashers: a shard holds keys whose
    /// shard hashes agree, which must say nothing about their hashes inside the map.
    shard_hasher: RandomState,
    /// `64 - log2(shards)`: the shard is the top bits of the key's hash.
    shard_shift: u32,
    /// The most counters one shard holds.
    per_shard: usize,
    /// Live counters dropped to make room for new ones.
    evicted: AtomicU64,
}

/// The default bound on counters held in memory (`memory_max_counters`).
pub use crate::settings::DEFAULT_MEMORY_MAX_COUNTERS as DEFAULT_MAX_COUNTERS;

impl MemoryBackend {
    /// A backend holding at most about `max_counters` counters (rounded up to a multiple of
    /// the number of shards).
    pub fn new(clock: Arc<dyn Clock>, max_counters: usize) -> Self {
        // Four shards per core keeps two cores' hits off one lock almost always; 16 at least.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let count = (4 * cores).next_power_of_two().max(16);
        let shards = (0..count)
            .map(|_| Mutex::new(IndexMap::with_hasher(RandomState::default())))
            .collect();
        MemoryBackend {
            clock,
            shards,
            shard_hasher: RandomState::default(),
            shard_shift: 64 - count.trailing_zeros(),
            per_shard: max_counters.div_ceil(count).max(1),
            evicted: AtomicU64::new(0),
        }
    }

    /// Applies one hit to the counter `key` and answers it. A counter that has expired
    /// answers as a new one. A hit that leaves a new counter as good as new (a check, a
    /// rejection) stores nothing.
    pub fn hit(&self, key: &CounterKey, limit: &Limit, hits: Hits) -> Decision {
        let mut shard = self.shard(key);
        // Read under the lock, so hits on one counter see the clock in the order they count.
        let now = self.clock.now_micros();
        if let Some(counter) = shard.get_mut(key) {
            if counter.expires_at() <= now {
                counter.reset();
            }
            return counter.hit(limit, now, hits);
        }
        let mut counter = Counter::new();
        let decision = counter.hit(limit, now, hits);
        if counter.expires_at() > now {
            self.make_room(&mut shard, now);
            shard.insert(key.clone(), counter);
        }
        decision
    }

    /// Makes room in a shard for one more counter (see the module's notes).
    fn make_room(&self, shard: &mut Counters, now: u64) {
        if make_room(shard, self.per_shard, now, Counter::expires_at) == Room::Evicted {
            self.evicted.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Forgets the counter `key`, as if never hit; whether there was one.
    pub fn remove(&self, key: &CounterKey) -> bool {
        self.shard(key).swap_remove(key).is_some()
    }

    /// Live counters dropped so far to make room for new ones (each started over when next
    /// hit): above zero, `memory_max_counters` is too small for the keys in use.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// Applies every hit, in order, only if no binding hit is rejected; otherwise changes
    /// nothing. Every counter of the request is decided under its shard's lock, all the
    /// shards held together, so no other request sees a state between the two outcomes.
    ///
    /// The hits run on copies of the counters, in order (a counter named twice sees the
    /// first hit before the second); the copies replace the counters only when the request
    /// passes. A rejected request answers each hit with the attempt's `allowed` and the
    /// remaining and reset of the counter as it stays (a check on the untouched state).
    pub fn hit_all_or_nothing(&self, hits: &[CounterHit<'_>]) -> Vec<Decision> {
        let mut locked = self.lock_all(hits);
        let now = self.clock.now_micros();
        let mut copies = Copies::default();
        let attempt: Vec<Decision> = hits
            .iter()
            .map(|hit| copies.hit(&locked, hit, hit.hits, now))
            .collect();
        let rejected = hits
            .iter()
            .zip(&attempt)
            .any(|(hit, decision)| hit.binding && !decision.allowed);
        if !rejected {
            copies.commit(&mut locked, now);
            return attempt;
        }
        let mut untouched = Copies::default();
        hits.iter()
            .zip(attempt)
            .map(|(hit, tried)| Decision {
                allowed: tried.allowed,
                ..untouched.hit(&locked, hit, Hits::take(0), now)
            })
            .collect()
    }

    /// Drops every counter whose state has expired; returns how many.
    pub fn remove_expired(&self) -> usize {
        let mut removed = 0;
        for shard in &self.shards {
            let mut shard = lock(shard);
            let now = self.clock.now_micros();
            let before = shard.len();
            shard.retain(|_, counter| counter.expires_at() > now);
            let after = shard.len();
            removed += before - after;
            // Give back the table a past burst of counters grew, once it is mostly empty.
            if shard.capacity() > 4 * after.max(64) {
                shard.shrink_to(2 * after);
            }
        }
        removed
    }

    /// How many counters are held.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|shard| lock(shard).len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs [`remove_expired`](Self::remove_expired) every `every` (at least 1 ms) on the
    /// current tokio runtime (it must be called from within one). The task holds the backend
    /// weakly and ends once it is dropped.
    pub fn spawn_sweeper(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let backend: Weak<Self> = Arc::downgrade(self);
        let every = every.max(Duration::from_millis(1));
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // The first tick completes at once; the first sweep is one period in.
            ticks.tick().await;
            loop {
                ticks.tick().await;
                let Some(backend) = backend.upgrade() else {
                    return;
                };
                let removed = backend.remove_expired();
                tracing::trace!(removed, "swept expired counters");
            }
        })
    }

    /// The locked shard that holds `key`.
    fn shard(&self, key: &CounterKey) -> MutexGuard<'_, Counters> {
        lock(&self.shards[self.shard_index(key)])
    }

    fn shard_index(&self, key: &CounterKey) -> usize {
        let hash = self.shard_hasher.hash_one(key);
        // `shard_shift` is 64 - log2(len) with len >= 16, so the index is below len.
        usize::try_from(hash >> self.shard_shift).unwrap_or(0)
    }

    /// Locks every shard that holds a counter of `hits`, each once, in ascending order: two
    /// requests that lock in one order cannot deadlock.
    fn lock_all(&self, hits: &[CounterHit<'_>]) -> LockedShards<'_> {
        let mut indices: Vec<usize> = hits.iter().map(|hit| self.shard_index(&hit.key)).collect();
        indices.sort_unstable();
        indices.dedup();
        let guards = indices
            .into_iter()
            .map(|index| (index, lock(&self.shards[index])))
            .collect();
        LockedShards {
            backend: self,
            guards,
        }
    }
}

/// The shards of one request's counters, locked together, ascending by index.
struct LockedShards<'b> {
    backend: &'b MemoryBackend,
    guards: Vec<(usize, MutexGuard<'b, Counters>)>,
}

impl LockedShards<'_> {
    /// Where the shard of `key` is in `guards` (`lock_all` locked the shard of every hit).
    fn position(&self, key: &CounterKey) -> usize {
        let index = self.backend.shard_index(key);
        self.guards
            .binary_search_by_key(&index, |(i, _)| *i)
            .expect("lock_all locked the shard of every hit")
    }

    /// A copy of the counter `key` as a hit would find it: expired or absent is new.
    fn copy(&self, key: &CounterKey, now: u64) -> Counter {
        let shard = &self.guards[self.position(key)].1;
        shard
            .get(key)
            .filter(|counter| counter.expires_at() > now)
            .cloned()
            .unwrap_or_default()
    }

    /// Stores `counter` as `key`'s state; one as good as new is dropped.
    fn store(&mut self, key: CounterKey, counter: Counter, now: u64) {
        let at = self.position(&key);
        let backend = self.backend;
        let shard = &mut self.guards[at].1;
        if counter.expires_at() > now {
            if let Some(known) = shard.get_mut(&key) {
                *known = counter;
            } else {
                backend.make_room(shard, now);
                shard.insert(key, counter);
            }
        } else {
            shard.swap_remove(&key);
        }
    }
}

/// Copies of the counters one request hits, in the order first hit (requests are small, so a
/// list beats a map).
#[derive(Default)]
struct Copies {
    counters: Vec<(CounterKey, Counter)>,
}

impl Copies {
    /// Applies `hits` to the copy of `hit`'s counter, copying it from `locked` first.
    fn hit(
        &mut self,
        locked: &LockedShards<'_>,
        hit: &CounterHit<'_>,
        hits: Hits,
        now: u64,
    ) -> Decision {
        let at = match self.counters.iter().position(|(key, _)| *key == hit.key) {
            Some(at) => at,
            None => {
                self.counters
                    .push((hit.key.clone(), locked.copy(&hit.key, now)));
                self.counters.len() - 1
            }
        };
        self.counters[at].1.hit(&hit.limit, now, hits)
    }

    /// Stores every copy in place of its counter.
    fn commit(self, locked: &mut LockedShards<'_>, now: u64) {
        for (key, counter) in self.counters {
            locked.store(key, counter, now);
        }
    }
}

/// Nothing under a shard lock panics; if something ever did, the counters would still be
/// plain data, and serving them beats failing every later hit on the shard.
fn lock(shard: &Shard) -> MutexGuard<'_, Counters> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::limiter::{Algorithm, Unit};

    const SECOND: u64 = 1_000_000;

    fn backend() -> (Arc<ManualClock>, MemoryBackend) {
        let clock = Arc::new(ManualClock::new(100 * SECOND));
        (
            clock.clone(),
            MemoryBackend::new(clock, DEFAULT_MAX_COUNTERS),
        )
    }

    fn key(name: &str) -> CounterKey {
        CounterKey::new("test", name, 0, &Limit::per(1, Unit::Second), [])
    }

    #[test]
    fn a_full_backend_keeps_each_new_counter_in_place_of_another() {
        let clock = Arc::new(ManualClock::new(100 * SECOND));
        // One counter per shard.
        let backend = MemoryBackend::new(clock.clone(), 1);
        let limit = Limit::per(5, Unit::Minute);
        let shards = backend.shards.len();
        for i in 0..4 * shards {
            let name = i.to_string();
            backend.hit(&key(&name), &limit, Hits::take(1));
            let now = backend.hit(&key(&name), &limit, Hits::take(0));
            assert_eq!(now.remaining, 4, "the newest counter is kept");
        }
        assert!(backend.len() <= shards, "{} counters", backend.len());
        assert!(
            backend.evicted() >= 3 * shards as u64,
            "{}",
            backend.evicted()
        );
    }

    #[test]
    fn room_is_made_from_expired_counters_first_and_that_is_no_eviction() {
        let clock = Arc::new(ManualClock::new(100 * SECOND));
        let backend = MemoryBackend::new(clock.clone(), 1);
        let limit = Limit::per(5, Unit::Second);
        let shards = backend.shards.len();
        // Fill every shard (and evict) with counters that expire within a second.
        for i in 0..4 * shards {
            backend.hit(&key(&i.to_string()), &limit, Hits::take(1));
        }
        let evicted = backend.evicted();
        clock.advance(SECOND);
        // The first new counter in a shard takes the place of its expired one: no eviction.
        // Only a second one in the same shard evicts (the first, which is live).
        let mut hit_shards = std::collections::HashSet::new();
        for i in 0..shards {
            let key = key(&format!("next-{i}"));
            hit_shards.insert(backend.shard_index(&key));
            backend.hit(&key, &limit, Hits::take(1));
        }
        assert_eq!(
            backend.evicted() - evicted,
            (shards - hit_shards.len()) as u64
        );
    }

    #[test]
    fn remove_expired_drops_idle_counters_and_keeps_live_ones() {
        let (clock, backend) = backend();
        backend.hit(&key("second"), &Limit::per(5, Unit::Second), Hits::take(1));
        backend.hit(&key("minute"), &Limit::per(5, Unit::Minute), Hits::take(1));
        clock.advance(SECOND);
        assert_eq!(backend.remove_expired(), 1);
        assert_eq!(backend.len(), 1);
        let left = backend.hit(&key("minute"), &Limit::per(5, Unit::Minute), Hits::take(0));
        assert_eq!(left.remaining, 4);
    }

    #[test]
    fn an_expired_counter_found_on_lookup_answers_as_new() {
        let (clock, backend) = backend();
        let limit = Limit {
            algorithm: Algorithm::SlidingLog,
            ..Limit::per(2, Unit::Second)
        };
        backend.hit(&key("k"), &limit, Hits::take(2));
        clock.advance(SECOND);
        let decision = backend.hit(&key("k"), &limit, Hits::take(0));
        assert_eq!((decision.remaining, decision.reset_micros), (2, 0));
    }

    #[test]
    fn a_check_on_an_unknown_key_stores_nothing() {
        let (_, backend) = backend();
        for algorithm in Algorithm::ALL {
            let limit = Limit {
                algorithm,
                ..Limit::per(5, Unit::Second)
            };
            backend.hit(&key("k"), &limit, Hits::take(0));
        }
        assert!(backend.is_empty());
    }

    #[test]
    fn a_rejected_hit_on_an_unknown_key_stores_nothing() {
        let (_, backend) = backend();
        backend.hit(&key("k"), &Limit::per(5, Unit::Second), Hits::take(6));
        assert!(backend.is_empty());
    }

    fn hit<'a>(name: &str, limit: &'a Limit, amount: u64) -> CounterHit<'a> {
        CounterHit {
            key: key(name),
            limit: std::borrow::Cow::Borrowed(limit),
            hits: Hits::take(amount),
            binding: true,
        }
    }

    #[test]
    fn a_rejected_request_changes_none_of_its_counters() {
        let (_, backend) = backend();
        let limit = Limit::per(5, Unit::Second);
        let decisions = backend.hit_all_or_nothing(&[hit("a", &limit, 2), hit("b", &limit, 6)]);
        assert_eq!(
            decisions
                .iter()
                .map(|d| (d.allowed, d.remaining))
                .collect::<Vec<_>>(),
            [(true, 5), (false, 5)]
        );
        assert!(backend.is_empty());
    }

    #[test]
    fn a_counter_named_twice_sees_both_hits_in_order() {
        let (_, backend) = backend();
        let limit = Limit::per(5, Unit::Second);
        let twice = [hit("a", &limit, 3), hit("a", &limit, 2)];
        let passed = backend.hit_all_or_nothing(&twice);
        assert_eq!(
            passed.iter().map(|d| d.remaining).collect::<Vec<_>>(),
            [2, 0]
        );
        let rejected = backend.hit_all_or_nothing(&[hit("a", &limit, 0), hit("a", &limit, 1)]);
        assert!(!rejected[1].allowed);
        assert_eq!(backend.hit(&key("a"), &limit, Hits::take(0)).remaining, 0);
    }

    #[test]
    fn a_non_binding_rejection_undoes_nothing() {
        let (_, backend) = backend();
        let limit = Limit::per(5, Unit::Second);
        let shadow = CounterHit {
            binding: false,
            ..hit("b", &limit, 6)
        };
        backend.hit_all_or_nothing(&[hit("a", &limit, 2), shadow]);
        assert_eq!(backend.hit(&key("a"), &limit, Hits::take(0)).remaining, 3);
    }

    #[tokio::test]
    async fn sweeper_removes_expired_counters_periodically() {
        let (clock, backend) = backend();
        let backend = Arc::new(backend);
        backend.hit(&key("idle"), &Limit::per(5, Unit::Second), Hits::take(1));
        backend.hit(&key("live"), &Limit::per(5, Unit::Hour), Hits::take(1));
        let sweeper = backend.spawn_sweeper(Duration::from_millis(5));
        clock.advance(SECOND);
        let swept = async {
            while backend.len() != 1 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), swept)
            .await
            .expect("the idle counter is swept, the live one kept");
        sweeper.abort();
    }

    #[tokio::test]
    async fn sweeper_ends_when_the_backend_is_dropped() {
        let (_, backend) = backend();
        let backend = Arc::new(backend);
        let sweeper = backend.spawn_sweeper(Duration::from_millis(5));
        drop(backend);
        tokio::time::timeout(Duration::from_secs(5), sweeper)
            .await
            .expect("the sweeper ends within a period of the drop")
            .expect("the sweeper does not panic");
    }
}
