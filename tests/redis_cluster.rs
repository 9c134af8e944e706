//! The redis-cluster backend end to end: the Lua scripts, real `floodgate` binaries and a real
//! six-node Redis Cluster (three primaries, three replicas), through a failover and a slot
//! migration. Each test starts its own cluster.

mod common;
mod harness;
mod lua_support;
mod redis_harness;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cases::cases;
use deadpool_redis::redis;
use floodgate::backend::redis::script::Scripts;
use floodgate::limiter::CounterKey;
use floodgate::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use floodgate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use harness::{
    ALGORITHMS, EVERY_ALGORITHM, Floodgate, OK, OVER_LIMIT, admitted, costing, descriptor, request,
};
use redis_harness::cluster::{Node, RedisCluster};

/// A floodgate on `cluster`, with a command timeout that a debug build on a loaded machine
/// always meets: these tests are about counting, where a timeout would be noise.
fn start(rules: &str, cluster: &RedisCluster) -> Floodgate {
    start_with(rules, cluster, &[], &[])
}

/// [`start`] with extra `serve` flags and environment.
fn start_with(
    rules: &str,
    cluster: &RedisCluster,
    flags: &[&str],
    env: &[(&str, &str)],
) -> Floodgate {
    let seeds = cluster.seeds();
    let mut all_flags = vec!["--backend", "redis-cluster", "--redis-url", &seeds];
    all_flags.extend_from_slice(flags);
    let mut all_env = vec![("FLOODGATE_REDIS_COMMAND_TIMEOUT_MS", "2000")];
    all_env.extend_from_slice(env);
    Floodgate::start_with_env(&[("rules.yaml", rules)], &all_flags, &all_env)
}

/// One request for one counter: `key` = `value` in `domain`.
fn ask_for(domain: &str, key: &str, value: &str) -> RateLimitRequest {
    request(domain, vec![descriptor(&[(key, value)])])
}

/// The keys of every counter whose descriptor is `key=value`, and the primary holding them.
/// (Keys end their hash tag with the descriptor, so `key=value}` finds them.)
fn homes(cluster: &RedisCluster, key: &str, value: &str) -> (Vec<String>, Node) {
    let needle = format!("{key}={value}}}");
    let mut found = Vec::new();
    for primary in cluster.primaries() {
        for stored in cluster.keys(primary) {
            if stored.contains(&needle) {
                found.push((stored, primary));
            }
        }
    }
    let Some(&(_, home)) = found.first() else {
        panic!("no key for {needle:?} on any primary");
    };
    assert!(
        found.iter().all(|(_, node)| *node == home),
        "the keys of one counter on two nodes: {found:?}"
    );
    (found.into_iter().map(|(stored, _)| stored).collect(), home)
}

#[tokio::test]
async fn every_case_holds_on_the_lua_scripts_across_the_cluster() {
    let cluster = RedisCluster::start();
    let seeds: Vec<String> = cluster
        .nodes()
        .into_iter()
        .map(|node| cluster.server(node).url())
        .collect();
    // Generous waits: the test's own connection is not what it measures (redis-rs gives up
    // on a reply after 500 ms by default, which a busy machine can take).
    let client = redis::cluster::ClusterClientBuilder::new(seeds)
        .connection_timeout(Duration::from_secs(10))
        .response_timeout(Duration::from_secs(60))
        .build()
        .expect("valid seed URLs");
    let mut connection = client
        .get_async_connection()
        .await
        .expect("connect to the cluster");
    let scripts = Scripts::new();
    lua_support::load(&mut connection, &scripts).await;

    let mut failures = Vec::new();
    let mut primaries = BTreeSet::new();
    for case in cases() {
        let key = CounterKey::new("cluster-cases", &case.name, 0, &case.limit, []);
        primaries.insert(cluster.primary_of(cluster.keyslot(key.as_str())));
        for (index, step) in case.steps.iter().enumerate() {
            let got = lua_support::hit(
                &mut connection,
                &scripts,
                key.as_str(),
                &case.limit,
                step.hits,
                step.at_micros,
            )
            .await;
            if got.as_ref() != Ok(&step.expect) {
                failures.push(format!(
                    "{} step {index} ({:?} at {}): expected {:?}, got {:?}",
                    case.name, step.hits, step.at_micros, step.expect, got
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(
        primaries.len(),
        3,
        "the cases' counters live on every primary"
    );
}

/// `consume_on_reject: false` on a cluster: the counters of one request live in different
/// slots, so a rejected request gives back what its other descriptors took, one round trip
/// later. Once every request has been answered, the counts are exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_request_gives_back_what_its_other_descriptors_took() {
    let cluster = RedisCluster::start();
    // No over-limit cache: every rejected request reaches the cluster and gives back.
    let server = start_with(
        EVERY_ALGORITHM,
        &cluster,
        &["--consume-on-reject", "false"],
        &[("FLOODGATE_REDIS_LOCAL_CACHE_SIZE", "0")],
    );
    let check = |key: &str| request("global", vec![costing(key, "cheap", 0)]);
    for key in ALGORITHMS {
        // `dear` costs 2 and admits 25 requests; `cheap` never runs out, so every rejected
        // request took 1 from it, and gave it back.
        let pair = request(
            "global",
            vec![costing(key, "cheap", 1), costing(key, "dear", 2)],
        );
        assert_eq!(admitted(&[&server], &pair, 8, 8).await, 25, "{key}");
        let left = server.ask(check(key)).await.statuses[0].limit_remaining;
        assert_eq!(left, 25, "{key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_share_one_exact_count_for_every_algorithm() {
    let cluster = RedisCluster::start();
    let a = start(EVERY_ALGORITHM, &cluster);
    let b = start(EVERY_ALGORITHM, &cluster);
    for algorithm in ALGORITHMS {
        let allowed = admitted(&[&a, &b], &ask_for("global", algorithm, "shared"), 16, 8).await;
        assert_eq!(
            allowed, 50,
            "{algorithm}: 128 requests over two servers against a limit of 50"
        );
    }
}

/// Five rules, limits 1 to 5 per day: descriptor `i` is allowed exactly `i + 1` times.
const SPREAD: &str = "
domain: spread
descriptors:
  - key: fixed_window
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: sliding_window
    rate_limit: {unit: day, requests_per_unit: 2, algorithm: sliding_window}
  - key: sliding_log
    rate_limit: {unit: day, requests_per_unit: 3, algorithm: sliding_log}
  - key: token_bucket
    rate_limit: {unit: day, requests_per_unit: 4, algorithm: token_bucket}
  - key: gcra
    rate_limit: {unit: day, requests_per_unit: 5, algorithm: gcra}
";

#[tokio::test]
async fn five_descriptors_on_three_primaries_get_five_right_decisions_in_one_call_each() {
    let cluster = RedisCluster::start();
    let server = start(SPREAD, &cluster);
    // The memory backend is the reference: the same rules, the same requests, its own counts.
    let reference = Floodgate::start(&[("rules.yaml", SPREAD)], &[]);
    let spread = |value: &str| {
        request(
            "spread",
            ALGORITHMS
                .iter()
                .map(|key| descriptor(&[(key, value)]))
                .collect(),
        )
    };

    // Counters land where their hash tags send them: try values until the five counters of
    // one request sit in five slots on all three primaries.
    let evalsha_calls = |cluster: &RedisCluster| -> u64 {
        (cluster.primaries().into_iter())
            .map(|node| {
                let stats = cluster.command(node, &["INFO", "commandstats"]);
                (stats.lines())
                    .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
                    .and_then(|rest| rest.split(',').next()?.parse().ok())
                    .unwrap_or(0)
            })
            .sum()
    };
    let mut chosen = None;
    for attempt in 0..30 {
        let value = format!("spread{attempt}");
        let before = evalsha_calls(&cluster);
        assert_eq!(
            decisions(&server.ask(spread(&value)).await),
            decisions(&reference.ask(spread(&value)).await),
            "{value}, request 1"
        );
        let calls = evalsha_calls(&cluster) - before;
        let placed: Vec<(u16, Node)> = ALGORITHMS
            .iter()
            .map(|key| {
                let (keys, node) = homes(&cluster, key, &value);
                (cluster.keyslot(&keys[0]), node)
            })
            .collect();
        let slots: BTreeSet<u16> = placed.iter().map(|(slot, _)| *slot).collect();
        let nodes: BTreeSet<Node> = placed.iter().map(|(_, node)| *node).collect();
        // The five hits went as one script call per primary (each primary's lane).
        assert_eq!(calls, nodes.len() as u64, "{value}: {placed:?}");
        if slots.len() == 5 && nodes.len() == 3 {
            chosen = Some(value);
            break;
        }
    }
    let value = chosen.expect("30 values without five slots on three primaries");

    for n in 2..=6 {
        let response = server.ask(spread(&value)).await;
        let codes: Vec<i32> = response.statuses.iter().map(|s| s.code).collect();
        let expected: Vec<i32> = (1..=5)
            .map(|limit| if n <= limit { OK } else { OVER_LIMIT })
            .collect();
        assert_eq!(codes, expected, "request {n}");
        assert_eq!(
            decisions(&response),
            decisions(&reference.ask(spread(&value)).await),
            "request {n}: against the memory backend"
        );
    }
}

/// What a response decided: the overall code, and each descriptor's code and remaining quota
/// (not the time to reset, which moves between two requests).
fn decisions(response: &RateLimitResponse) -> (i32, Vec<(i32, u32)>) {
    let statuses = response.statuses.iter();
    (
        response.overall_code,
        statuses.map(|s| (s.code, s.limit_remaining)).collect(),
    )
}

/// Counters large enough never to run out: each answer's `limit_remaining` tells which count
/// the hit got (fixed window: count = limit − remaining).
const COUNTERS: &str = "
domain: failover
descriptors:
  - key: counter
    rate_limit: {unit: day, requests_per_unit: 1000000}
";
const COUNTER_LIMIT: u64 = 1_000_000;
const COUNTER_NAMES: [&str; 8] = ["c0", "c1", "c2", "c3", "c4", "c5", "c6", "c7"];

/// Clients sending `requests` in turn, from `tasks` concurrent tasks, until stopped (or
/// dropped: a load left running against a dead floodgate would spin on failed requests).
/// `record` sees each answer with the index of its request.
struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// After a failed request, a load task waits this long: failures come at once, and a task
/// that does not wait would starve everything else of the two cores.
const AFTER_FAILURE: Duration = Duration::from_millis(10);

type Answer = Result<tonic::Response<RateLimitResponse>, tonic::Status>;

impl Load {
    fn start(
        server: &Floodgate,
        tasks: usize,
        requests: Vec<RateLimitRequest>,
        record: impl Fn(usize, Answer) + Send + Sync + 'static,
    ) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(requests);
        let record = Arc::new(record);
        let address = format!("http://{}", server.grpc_addr);
        let tasks = (0..tasks)
            .map(|task| {
                let (stop, requests, record) = (stop.clone(), requests.clone(), record.clone());
                let address = address.clone();
                tokio::spawn(async move {
                    let mut client = RateLimitServiceClient::connect(address)
                        .await
                        .expect("connect to floodgate");
                    let mut next = task;
                    while !stop.load(Ordering::Relaxed) {
                        let index = next % requests.len();
                        next += 1;
                        let answer = client.should_rate_limit(requests[index].clone()).await;
                        let failed = answer.is_err();
                        record(index, answer);
                        if failed {
                            tokio::time::sleep(AFTER_FAILURE).await;
                        }
                    }
                })
            })
            .collect();
        Load { stop, tasks }
    }

    async fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for task in std::mem::take(&mut self.tasks) {
            task.await.expect("load task");
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// What the failover load saw: per counter, each count a hit got and whether the answer came
/// after the replica's promotion was seen; and every failed request's status.
#[derive(Default)]
struct Seen {
    counts: BTreeMap<usize, Vec<(u64, bool)>>,
    errors: Vec<tonic::Status>,
}

/// Waits until every counter in `counters` has `at_least` answers matching `which`.
async fn wait_for_answers(
    seen: &Arc<Mutex<Seen>>,
    counters: &[usize],
    at_least: usize,
    which: impl Fn(bool) -> bool,
    bound: Duration,
    what: &str,
) {
    let deadline = Instant::now() + bound;
    loop {
        let fewest = {
            let seen = seen.lock().expect("not poisoned");
            counters
                .iter()
                .map(|counter| {
                    seen.counts.get(counter).map_or(0, |counts| {
                        counts.iter().filter(|(_, after)| which(*after)).count()
                    })
                })
                .min()
                .unwrap_or(0)
        };
        if fewest >= at_least {
            return;
        }
        let errors = seen.lock().expect("not poisoned").errors.len();
        assert!(
            Instant::now() < deadline,
            "{what}: a counter has {fewest} answers after {bound:?} ({errors} failed requests)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A primary dies under load. Its replica takes over (cluster-node-timeout 1 s) and the same
/// floodgate, never restarted, decides again. What is asserted, per counter:
///
/// - on the surviving primaries, no count is ever handed out twice: nothing went backwards;
/// - on the lost primary, each count up to `R`, what its replica held when the primary was
///   killed, is handed out at most once, and every count after the promotion is above `R`.
///   Counts above `R` may repeat: hits the primary acknowledged but had not yet replicated
///   are lost with it (Redis replication is asynchronous);
/// - requests that failed meanwhile failed by the rule's policy (the default: an error);
/// - the new primary has the scripts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_is_replaced_and_decisions_resume_without_a_restart() {
    let mut cluster = RedisCluster::start();
    let server = start(COUNTERS, &cluster);
    let promoted = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let requests = COUNTER_NAMES
        .iter()
        .map(|name| ask_for("failover", "counter", name))
        .collect();
    let load = Load::start(&server, 4, requests, {
        let (promoted, seen) = (promoted.clone(), seen.clone());
        move |counter, answer| {
            let after = promoted.load(Ordering::SeqCst);
            let mut seen = seen.lock().expect("not poisoned");
            match answer {
                Ok(response) => {
                    let status = &response.get_ref().statuses[0];
                    assert_eq!(status.code, OK, "counter {counter} never runs out");
                    let count = COUNTER_LIMIT - u64::from(status.limit_remaining);
                    seen.counts.entry(counter).or_default().push((count, after));
                }
                Err(status) => seen.errors.push(status),
            }
        }
    });
    let all: Vec<usize> = (0..COUNTER_NAMES.len()).collect();
    wait_for_answers(
        &seen,
        &all,
        20,
        |_| true,
        Duration::from_secs(30),
        "warm-up",
    )
    .await;

    let placed: Vec<(String, Node)> = COUNTER_NAMES
        .iter()
        .map(|name| {
            let (keys, node) = homes(&cluster, "counter", name);
            (keys[0].clone(), node)
        })
        .collect();
    let victim = placed[0].1;
    let replica = cluster.replica_of(victim);
    let lost: Vec<usize> = all
        .iter()
        .copied()
        .filter(|&c| placed[c].1 == victim)
        .collect();
    // What the replica holds, read at the last moment: it only grows until the promotion.
    let replicated: BTreeMap<usize, u64> = lost
        .iter()
        .map(|&counter| {
            let count = cluster
                .replica_read(replica, &["GET", &placed[counter].0])
                .map_or(0, |count| count.parse().expect("a count"));
            (counter, count)
        })
        .collect();
    cluster.kill(victim);
    let killed = Instant::now();

    let cluster = tokio::task::spawn_blocking(move || {
        cluster.wait_for_failover(victim, replica);
        cluster
    })
    .await
    .expect("failover wait");
    promoted.store(true, Ordering::SeqCst);
    let promotion = killed.elapsed();
    wait_for_answers(
        &seen,
        &lost,
        20,
        |after| after,
        Duration::from_secs(30),
        "decisions after the failover",
    )
    .await;
    load.stop().await;
    // Loaded at start-up if the cluster listed the replica then (Redis lists a replica only
    // once some write has reached it), else on its first NOSCRIPT after the promotion.
    assert!(
        knows_every_script(&cluster, replica),
        "the new primary lacks scripts"
    );

    let seen = seen.lock().expect("not poisoned");
    for status in &seen.errors {
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    }
    for counter in all {
        let counts = &seen.counts[&counter];
        let repeated = repeated(counts.iter().map(|&(count, _)| count));
        match replicated.get(&counter) {
            None => assert!(
                repeated.is_empty(),
                "counter {counter} on a surviving primary went backwards: {repeated:?}"
            ),
            Some(&held) => {
                assert!(
                    repeated.iter().all(|&count| count > held),
                    "counter {counter}: replicated counts (up to {held}) handed out again: \
                     {repeated:?}"
                );
                let after: Vec<u64> = counts
                    .iter()
                    .filter(|(_, after)| *after)
                    .map(|(count, _)| *count)
                    .collect();
                assert!(
                    after.iter().all(|&count| count > held),
                    "counter {counter}: a count at or below the replicated {held} after the \
                     promotion: {after:?}"
                );
            }
        }
    }
    eprintln!(
        "failover: promotion seen after {promotion:?}; {} requests failed meanwhile; \
         counters on the lost primary: {lost:?}, replicated {replicated:?}",
        seen.errors.len()
    );
}

const MIGRATING_LIMIT: usize = 300;

/// Each algorithm's counter moves to another primary while clients hit it: slots opened
/// (IMPORTING / MIGRATING: requests for keys already moved are answered ASK), keys moved one
/// by one (a sliding log's two keys apart: in between its script is answered TRYAGAIN), slots
/// closed (SETSLOT NODE: the old primary answers MOVED). No hit may be counted twice or on a
/// copy: each counter admits exactly its limit. And the move is invisible to clients: every
/// redirect is followed, so no request fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_admit_exactly_their_limit_while_their_slots_migrate() {
    let cluster = RedisCluster::start();
    let rules = EVERY_ALGORITHM.replace("50", &MIGRATING_LIMIT.to_string());
    let server = start(&rules, &cluster);
    let done: Arc<[AtomicUsize; 5]> = Arc::new(Default::default());
    let allowed: Arc<[AtomicUsize; 5]> = Arc::new(Default::default());
    let errors = Arc::new(Mutex::new(Vec::new()));
    let requests = ALGORITHMS
        .iter()
        .map(|algorithm| ask_for("global", algorithm, "migrating"))
        .collect();
    let load = Load::start(&server, 4, requests, {
        let (done, allowed, errors) = (done.clone(), allowed.clone(), errors.clone());
        move |algorithm, answer| {
            match answer {
                Ok(response) if response.get_ref().overall_code == OK => {
                    allowed[algorithm].fetch_add(1, Ordering::SeqCst);
                }
                Ok(_) => {}
                Err(status) => errors.lock().expect("not poisoned").push(status),
            }
            done[algorithm].fetch_add(1, Ordering::SeqCst);
        }
    });
    let rounds = || {
        done.iter()
            .map(|count| count.load(Ordering::SeqCst))
            .min()
            .unwrap_or(0)
    };
    let wait_rounds = |at_least: usize, what: &'static str| {
        let rounds = &rounds;
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            while rounds() < at_least {
                assert!(
                    Instant::now() < deadline,
                    "{what}: only {} rounds",
                    rounds()
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };

    wait_rounds(20, "warm-up").await;
    let primaries = cluster.primaries();
    // Per algorithm: its keys, its slot, where it is and where it goes.
    let moves: Vec<(Vec<String>, u16, Node, Node)> = ALGORITHMS
        .iter()
        .map(|algorithm| {
            let (keys, source) = homes(&cluster, algorithm, "migrating");
            let slot = cluster.keyslot(&keys[0]);
            let next = primaries
                .iter()
                .position(|&p| p == source)
                .expect("a primary")
                + 1;
            (keys, slot, source, primaries[next % primaries.len()])
        })
        .collect();

    for (_, slot, source, target) in &moves {
        cluster.open_slot(*slot, *source, *target);
    }
    wait_rounds(60, "hits while the slots are open").await;
    for (keys, _, source, target) in &moves {
        for key in keys {
            cluster.migrate_key(key, *source, *target);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    wait_rounds(100, "hits while the keys live on the new primaries").await;
    for (_, slot, source, target) in &moves {
        cluster.close_slot(*slot, *source, *target);
    }
    wait_rounds(MIGRATING_LIMIT + 60, "hits past the limit").await;
    load.stop().await;

    let errors = errors.lock().expect("not poisoned");
    let messages: Vec<&str> = errors.iter().map(tonic::Status::message).collect();
    assert!(messages.is_empty(), "requests failed: {messages:?}");
    for (index, algorithm) in ALGORITHMS.iter().enumerate() {
        assert_eq!(
            allowed[index].load(Ordering::SeqCst),
            MIGRATING_LIMIT,
            "{algorithm}: {} requests across the migration",
            done[index].load(Ordering::SeqCst),
        );
    }
    for (algorithm, (keys, slot, _, target)) in ALGORITHMS.iter().zip(&moves) {
        assert_eq!(cluster.primary_of(*slot), *target, "slot {slot} moved");
        let (now, home) = homes(&cluster, algorithm, "migrating");
        assert_eq!(
            (home, now.len()),
            (*target, keys.len()),
            "{algorithm}: {keys:?}"
        );
    }
    let asking: usize = primaries
        .iter()
        .map(|p| command_calls(&cluster.command(*p, &["INFO", "commandstats"]), "asking"))
        .sum();
    assert!(asking > 0, "no request was ever redirected by ASK");
}

/// Whether `node` has every rate-limit script (SCRIPT EXISTS).
fn knows_every_script(cluster: &RedisCluster, node: Node) -> bool {
    let hashes: Vec<String> = Scripts::new()
        .all()
        .map(|script| script.get_hash().to_owned())
        .collect();
    let mut connection = cluster
        .server(node)
        .client()
        .get_connection_with_timeout(Duration::from_secs(5))
        .expect("connect to a node");
    let known: Vec<bool> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(&hashes)
        .query(&mut connection)
        .expect("SCRIPT EXISTS");
    known.iter().all(|&known| known)
}

/// The counts handed out more than once.
fn repeated(counts: impl IntoIterator<Item = u64>) -> Vec<u64> {
    let mut issued: BTreeMap<u64, usize> = BTreeMap::new();
    for count in counts {
        *issued.entry(count).or_default() += 1;
    }
    issued
        .into_iter()
        .filter(|&(_, times)| times > 1)
        .map(|(count, _)| count)
        .collect()
}

/// How many times INFO commandstats says `command` ran.
fn command_calls(stats: &str, command: &str) -> usize {
    stats
        .lines()
        .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .and_then(|calls| calls.parse().ok())
        .unwrap_or(0)
}
