//! Drives the shared table of algorithm cases through the memory backend.

mod common;

use std::collections::HashSet;
use std::sync::Arc;

use common::cases::{Case, cases};
use floodgate::backend::MemoryBackend;
use floodgate::backend::memory::DEFAULT_MAX_COUNTERS;
use floodgate::clock::ManualClock;
use floodgate::limiter::CounterKey;

#[test]
fn every_case_holds_on_the_memory_backend() {
    let failures: Vec<String> = cases().iter().flat_map(run).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn case_names_are_unique() {
    let cases = cases();
    let names: HashSet<&str> = cases.iter().map(|case| case.name.as_str()).collect();
    assert_eq!(names.len(), cases.len());
}

/// Runs one case on a fresh backend and one counter; returns a line per step that differs.
fn run(case: &Case) -> Vec<String> {
    let clock = Arc::new(ManualClock::new(0));
    let backend = MemoryBackend::new(clock.clone(), DEFAULT_MAX_COUNTERS);
    let key = CounterKey::new("cases", &case.name, 0, &case.limit, []);
    let mut failures = Vec::new();
    for (index, step) in case.steps.iter().enumerate() {
        clock.set(step.at_micros);
        let got = backend.hit(&key, &case.limit, step.hits);
        if got != step.expect {
            failures.push(format!(
                "{} step {index} ({:?} at {}): expected {:?}, got {:?}",
                case.name, step.hits, step.at_micros, step.expect, got
            ));
        }
    }
    failures
}
