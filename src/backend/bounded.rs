//! Room in a bounded map of expiring entries, made in constant time.
//!
//! The counters of the memory backend and the over-limit cache each live in maps with a
//! bound on their size. When one is full, an entry must go before another can come in, and
//! finding the best one to drop (an expired entry, else the one expiring first) would take a
//! scan of the whole map: at a million entries, a scan on every new key of an abusive client.
//! Instead a few entries are picked at random and the one that expires first among them goes,
//! as Redis' own `maxmemory` eviction does. That costs the same at any size; the entry dropped
//! is expired or expires soon, with a probability that grows with the number sampled.

use std::hash::{BuildHasher, Hash};

use indexmap::IndexMap;

/// Entries looked at to choose the one to drop (Redis' default `maxmemory-samples`).
const SAMPLES: usize = 5;

/// What making room took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Room {
    /// The map had room already.
    Free,
    /// An expired entry was dropped.
    Expired,
    /// A live entry was dropped, the one expiring first of those sampled.
    Evicted,
}

/// Makes room in `map` for one more entry, so that it holds at most `capacity` (at least 1)
/// afterwards: drops, if the map is full, the entry that expires first among [`SAMPLES`] picked
/// at random, stopping early at an expired one. `expires_at` reads an entry's expiry (µs
/// since the epoch), `now` is the current instant.
pub fn make_room<K, V, S>(
    map: &mut IndexMap<K, V, S>,
    capacity: usize,
    now: u64,
    expires_at: impl Fn(&V) -> u64,
) -> Room
where
    K: Hash + Eq,
    S: BuildHasher,
{
    let len = map.len();
    if len < capacity.max(1) {
        return Room::Free;
    }
    let expiry = |index: usize| {
        map.get_index(index)
            .map_or(0, |(_, value)| expires_at(value))
    };
    let mut victim = fastrand::usize(..len);
    let mut soonest = expiry(victim);
    for _ in 1..SAMPLES {
        if soonest <= now {
            break;
        }
        let index = fastrand::usize(..len);
        let at = expiry(index);
        if at < soonest {
            (victim, soonest) = (index, at);
        }
    }
    map.swap_remove_index(victim);
    if soonest <= now {
        Room::Expired
    } else {
        Room::Evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(expiries: impl IntoIterator<Item = u64>) -> IndexMap<u64, u64> {
        expiries
            .into_iter()
            .enumerate()
            .map(|(i, at)| (i as u64, at))
            .collect()
    }

    #[test]
    fn a_map_with_room_is_left_alone() {
        let mut entries = map([10, 20]);
        assert_eq!(make_room(&mut entries, 3, 0, |at| *at), Room::Free);
        assert_eq!(entries.len(), 2);
    }

    #[test]
    fn a_full_map_loses_one_entry_and_an_expired_one_when_all_are() {
        let mut entries = map([1, 2, 3, 4]);
        assert_eq!(make_room(&mut entries, 4, 10, |at| *at), Room::Expired);
        assert_eq!(entries.len(), 3);
    }

    #[test]
    fn a_full_map_of_live_entries_evicts_one() {
        let mut entries = map([100, 200]);
        assert_eq!(make_room(&mut entries, 2, 10, |at| *at), Room::Evicted);
        assert_eq!(entries.len(), 1);
    }

    #[test]
    fn the_entry_dropped_mostly_expires_among_the_first() {
        // 1,000 entries expiring at 1..=1000: the one dropped is the soonest of five picked at
        // random, whose expected rank is 1,000 / 6. Over 500 rounds the mean stays far below
        // the 500 a single random pick would average.
        let mut total = 0;
        for _ in 0..500 {
            let mut entries = map(1..=1000);
            make_room(&mut entries, 1000, 0, |at| *at);
            let gone = (1..=1000).find(|at| !entries.values().any(|v| v == at));
            total += gone.expect("one dropped");
        }
        let mean = total / 500;
        assert!(
            (120..=220).contains(&mean),
            "mean rank of the dropped entry: {mean}"
        );
    }
}
