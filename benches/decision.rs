//! Where a decision's CPU goes, without the network: rule matching, the counter key, one
//! memory-backend hit, the over-limit cache taking a new key when full, and a whole
//! `ShouldRateLimit` in process.
//!
//! `cargo bench --bench decision`

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};

use floodgate::backend::memory::DEFAULT_MAX_COUNTERS;
use floodgate::backend::{Backend, MemoryBackend, OverLimitCache};
use floodgate::clock::SystemClock;
use floodgate::limiter::{CounterKey, Decision, Hits, Limit, Unit};
use floodgate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use floodgate::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use floodgate::rules::{Entry, RuleSet};
use floodgate::service::{RateLimiter, ServiceOptions};

const RULES: &str = "
domain: bench
descriptors:
  - key: user_id
    rate_limit: { unit: second, requests_per_unit: 1000000 }
  - key: path
    value: /api/*/orders/*
    rate_limit: { unit: minute, requests_per_unit: 100 }
  - key: path
    value: /health
    rate_limit: { unlimited: true }
  - key: tenant
    value: acme
    descriptors:
      - key: user_id
        rate_limit: { unit: hour, requests_per_unit: 5000, algorithm: gcra }
";

fn rules() -> RuleSet {
    RuleSet::from_sources(&[("bench.yaml".into(), RULES.into())]).expect("bench rules load")
}

fn matching(c: &mut Criterion) {
    let rules = rules();
    let domain = rules.domain("bench").expect("domain");
    let mut group = c.benchmark_group("match");
    let cases = [
        ("key_only_default", vec![Entry::new("user_id", "k1234")]),
        ("exact", vec![Entry::new("path", "/health")]),
        (
            "wildcard_two_stars",
            vec![Entry::new("path", "/api/v2/orders/991")],
        ),
        (
            "nested_two_entries",
            vec![Entry::new("tenant", "acme"), Entry::new("user_id", "u7")],
        ),
        ("no_match", vec![Entry::new("nothing", "x")]),
    ];
    for (name, entries) in &cases {
        group.bench_function(*name, |b| b.iter(|| domain.find(black_box(entries))));
    }
    group.finish();
}

fn counting(c: &mut Criterion) {
    let limit = Limit::per(1_000_000, Unit::Second);
    c.bench_function("counter_key", |b| {
        b.iter(|| {
            CounterKey::new(
                "bench",
                "bench.user_id",
                0,
                &limit,
                [("user_id", black_box("k1234"))],
            )
        })
    });
    let memory = MemoryBackend::new(Arc::new(SystemClock), DEFAULT_MAX_COUNTERS);
    let keys: Vec<CounterKey> = (0..10_000)
        .map(|i| {
            CounterKey::new(
                "bench",
                "bench.user_id",
                0,
                &limit,
                [("user_id", format!("k{i}").as_str())],
            )
        })
        .collect();
    let mut i = 0;
    c.bench_function("memory_hit_10k_keys", |b| {
        b.iter(|| {
            i = (i + 1) % keys.len();
            memory.hit(&keys[i], &limit, Hits::take(1))
        })
    });

    // A full cache of counters exhausted for an hour, told of one more exhausted key at a
    // time: what each new key an abusive client exhausts costs once the cache is full.
    let cache = OverLimitCache::new(100_000, Arc::new(SystemClock));
    let exhausted = Decision {
        allowed: false,
        remaining: 0,
        reset_micros: 3_600_000_000,
    };
    let key = |i: u64| {
        let value = format!("k{i}");
        CounterKey::new(
            "bench",
            "bench.user_id",
            0,
            &limit,
            [("user_id", value.as_str())],
        )
    };
    for i in 0..200_000 {
        cache.observe(&key(i), &exhausted, cache.now_micros());
    }
    let fresh: Vec<CounterKey> = (1_000_000..1_010_000).map(key).collect();
    let mut i = 0;
    c.bench_function("over_limit_cache_full_new_key", |b| {
        b.iter(|| {
            i = (i + 1) % fresh.len();
            cache.observe(&fresh[i], &exhausted, cache.now_micros())
        })
    });
}

fn deciding(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let memory = Arc::new(MemoryBackend::new(
        Arc::new(SystemClock),
        DEFAULT_MAX_COUNTERS,
    ));
    let limiter = RateLimiter::new(
        rules(),
        Backend::memory(memory.clone()),
        memory,
        ServiceOptions::default(),
    );
    let requests: Vec<RateLimitRequest> = (0..10_000)
        .map(|i| RateLimitRequest {
            domain: "bench".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user_id".into(),
                    value: format!("k{i}"),
                }],
                ..Default::default()
            }],
            hits_addend: 0,
        })
        .collect();
    let mut i = 0;
    c.bench_function("should_rate_limit_in_process", |b| {
        b.iter(|| {
            i = (i + 1) % requests.len();
            runtime.block_on(limiter.should_rate_limit(&requests[i]))
        })
    });
}

criterion_group!(benches, matching, counting, deciding);
criterion_main!(benches);
