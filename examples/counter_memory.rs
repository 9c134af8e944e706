//! Measures what one counter costs the memory backend: inserts 1,000,000 fixed_window
//! counters (or as many as the first argument says) and reports the growth of the process'
//! resident memory per counter.
//!
//! Run: `cargo run --release --example counter_memory [COUNT]` (a debug build measures the
//! same sizes, only more slowly). Linux only: it reads `/proc/self/statm`.

use std::sync::Arc;

use floodgate::backend::MemoryBackend;
use floodgate::clock::ManualClock;
use floodgate::limiter::{Counter, CounterKey, Hits, Limit, Unit};

fn main() -> Result<(), String> {
    let counters: usize = match std::env::args().nth(1) {
        Some(count) => count.parse().map_err(|e| format!("COUNT {count:?}: {e}"))?,
        None => 1_000_000,
    };
    let limit = Limit::per(100, Unit::Minute);
    // Keys shaped like a real one: a user id in a per-user rule. Built before the first
    // reading, so only what the backend keeps (its own copy of each key, and the tables) is
    // measured.
    let keys: Vec<CounterKey> = (0..counters)
        .map(|i| {
            let user = format!("user-{i:07}");
            CounterKey::new("api", "per_user", 0, &limit, [("user_id", user.as_str())])
        })
        .collect();
    let clock = Arc::new(ManualClock::new(1_700_006_400_000_000));
    // A bound well above the count: nothing is evicted.
    let backend = MemoryBackend::new(clock, 2 * counters);

    let before = resident_bytes()?;
    for key in &keys {
        backend.hit(key, &limit, Hits::take(1));
    }
    let after = resident_bytes()?;

    let per_counter = (after.saturating_sub(before)) as f64 / counters as f64;
    println!("counters:            {}", backend.len());
    println!("key length:          {} bytes", keys[0].as_str().len());
    println!("size_of::<Counter>:  {} bytes", size_of::<Counter>());
    println!("size_of::<CounterKey>: {} bytes", size_of::<CounterKey>());
    println!("resident before:     {} MiB", before >> 20);
    println!("resident after:      {} MiB", after >> 20);
    println!("per counter:         {per_counter:.0} bytes");
    Ok(())
}

/// Resident set size: the second field of `/proc/self/statm`, in pages.
fn resident_bytes() -> Result<u64, String> {
    let statm = std::fs::read_to_string("/proc/self/statm").map_err(|e| e.to_string())?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|field| field.parse().ok())
        .ok_or("unexpected /proc/self/statm")?;
    Ok(pages * page_size()?)
}

/// The kernel page size, as `/proc/self/smaps` reports it for the first mapping.
fn page_size() -> Result<u64, String> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").map_err(|e| e.to_string())?;
    smaps
        .lines()
        .find_map(|line| line.strip_prefix("KernelPageSize:"))
        .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| "no KernelPageSize in /proc/self/smaps".to_owned())
}
