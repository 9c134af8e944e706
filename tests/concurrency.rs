//! The memory backend stays exact when many threads hit the same counters at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;

use floodgate::backend::MemoryBackend;
use floodgate::backend::memory::DEFAULT_MAX_COUNTERS;
use floodgate::clock::ManualClock;
use floodgate::limiter::{Algorithm, CounterKey, Hits, Limit, Unit};

const THREADS: usize = 8;
/// 2023-11-15T00:00:00Z; the clock stays frozen there, so nothing refills or rotates.
const NOW: u64 = 1_700_006_400_000_000;

fn backend() -> MemoryBackend {
    MemoryBackend::new(Arc::new(ManualClock::new(NOW)), DEFAULT_MAX_COUNTERS)
}

fn limit(algorithm: Algorithm, requests_per_hour: u32) -> Limit {
    Limit {
        algorithm,
        ..Limit::per(requests_per_hour, Unit::Hour)
    }
}

fn key(name: &str, limit: &Limit) -> CounterKey {
    CounterKey::new("concurrency", name, 0, limit, [])
}

/// Runs `work(thread_index)` on every thread at once; sums what they return.
fn race(work: impl Fn(usize) -> u64 + Sync) -> u64 {
    let start = Barrier::new(THREADS);
    let total = AtomicU64::new(0);
    thread::scope(|scope| {
        for index in 0..THREADS {
            let (start, total, work) = (&start, &total, &work);
            scope.spawn(move || {
                start.wait();
                total.fetch_add(work(index), Ordering::Relaxed);
            });
        }
    });
    total.into_inner()
}

#[test]
fn one_counter_admits_exactly_its_limit_under_contention() {
    for algorithm in Algorithm::ALL {
        let backend = backend();
        let limit = limit(algorithm, 100);
        let key = key("one", &limit);
        let admitted = race(|_| {
            (0..50)
                .filter(|_| backend.hit(&key, &limit, Hits::take(1)).allowed)
                .count() as u64
        });
        assert_eq!(admitted, 100, "{algorithm:?}");
        let check = backend.hit(&key, &limit, Hits::take(0));
        assert_eq!(check.remaining, 0, "{algorithm:?}");
    }
}

#[test]
fn costly_hits_never_overshoot_under_contention() {
    for algorithm in Algorithm::ALL {
        let backend = backend();
        let limit = limit(algorithm, 100);
        let key = key("costly", &limit);
        // Costs 1..=7 never sum to more than the limit, and once no cost fits, none passes.
        let admitted = race(|index| {
            let cost = index as u64 % 7 + 1;
            (0..40)
                .filter(|_| backend.hit(&key, &limit, Hits::take(cost)).allowed)
                .count() as u64
                * cost
        });
        let left = backend.hit(&key, &limit, Hits::take(0)).remaining;
        assert_eq!(admitted + left, 100, "{algorithm:?}");
        assert!(
            left < 7,
            "{algorithm:?}: {left} left, a cost that fits was refused"
        );
    }
}

#[test]
fn many_counters_each_admit_exactly_their_limit_under_contention() {
    const KEYS: usize = 64;
    for algorithm in Algorithm::ALL {
        let backend = backend();
        let limit = limit(algorithm, 10);
        let keys: Vec<CounterKey> = (0..KEYS).map(|i| key(&i.to_string(), &limit)).collect();
        let admitted = race(|index| {
            let mut admitted = 0;
            for round in 0..20 {
                // Each thread walks the keys from its own offset, so threads collide on
                // different counters at different times.
                for i in 0..KEYS {
                    let key = &keys[(i + index * 7 + round) % KEYS];
                    admitted += u64::from(backend.hit(key, &limit, Hits::take(1)).allowed);
                }
            }
            admitted
        });
        assert_eq!(admitted, 10 * KEYS as u64, "{algorithm:?}");
        assert_eq!(backend.len(), KEYS, "{algorithm:?}");
        for key in &keys {
            let check = backend.hit(key, &limit, Hits::take(0));
            assert_eq!(check.remaining, 0, "{algorithm:?} {key}");
        }
    }
}
