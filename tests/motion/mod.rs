//! Traffic for the tests of Redis in motion: clients of two floodgate servers hammering many
//! counters of every algorithm while a test changes the deployment under them (a cluster in
//! `redis_in_motion.rs`, sentinels in `sentinel_in_motion.rs`), every answer recorded with
//! when its request was sent, and what the answers came to.
//!
//! The load moves through generations of counters: once every counter of a generation is
//! exhausted (where the over-limit cache would answer without Redis), the clients move to the
//! next. However long a change takes, Redis decides the hits throughout it.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floodgate::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use floodgate::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

use super::harness::{ALGORITHMS, Floodgate, OK, OVER_LIMIT, descriptor, request};

/// Each counter's limit: per year, so no bucket refills noticeably during a test and no
/// window rolls (a fixed window of a year ends once in 365 days; an hour's did, when a run
/// crossed the top of the hour, and its counters admitted a second limit).
pub const LIMIT: usize = 40;
/// Counters per algorithm in a generation: 200 counters in all, spread over every primary.
pub const PER_ALGORITHM: usize = 40;
/// Client tasks, half on each server.
pub const CLIENTS: usize = 8;
/// What a primary's loss may cost besides the cluster's own outage: requests sent later than
/// this after the cluster is whole again are decided (docs/redis.md, "Redis in motion").
pub const MARGIN: Duration = Duration::from_secs(1);

fn rules() -> String {
    let mut rules = String::from("domain: motion\ndescriptors:\n");
    for algorithm in ALGORITHMS {
        rules.push_str(&format!(
            "  - key: {algorithm}\n    rate_limit: {{unit: year, requests_per_unit: {LIMIT}, \
             algorithm: {algorithm}}}\n"
        ));
    }
    rules
}

/// One counter: its algorithm's index and its number within a generation.
pub type Counter = (usize, usize);

/// The descriptor value of `counter` in `generation`.
pub fn value(generation: usize, (_, number): Counter) -> String {
    format!("g{generation}-{number}")
}

pub fn counters() -> impl Iterator<Item = Counter> {
    (0..ALGORITHMS.len()).flat_map(|algorithm| (0..PER_ALGORITHM).map(move |n| (algorithm, n)))
}

fn ask(generation: usize, counter: Counter) -> RateLimitRequest {
    let key = ALGORITHMS[counter.0];
    request(
        "motion",
        vec![descriptor(&[(key, &value(generation, counter))])],
    )
}

/// One answer the clients got.
#[derive(Debug, Clone)]
pub struct Answer {
    pub generation: usize,
    pub counter: Counter,
    /// When the request was sent.
    pub sent: Instant,
    /// When its answer came.
    pub answered: Instant,
    pub outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Admitted,
    Rejected,
    Failed(String),
}

/// Two floodgate servers on one deployment and the clients hammering them.
pub struct Traffic {
    /// Kept running (and stopped when dropped) while the clients use them.
    _servers: [Floodgate; 2],
    pub answers: Arc<Mutex<Vec<Answer>>>,
    generation: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    clients: Vec<tokio::task::JoinHandle<()>>,
}

impl Traffic {
    /// Two servers with the `backend` flags (`--backend`, `--redis-url`, …) and the clients,
    /// started.
    pub async fn start(backend: &[&str]) -> Traffic {
        let rules = rules();
        let serve = || {
            Floodgate::start_with_env(
                &[("rules.yaml", &rules)],
                backend,
                // A debug build on a loaded machine always meets this: these tests are about
                // what a deployment's changes cost, where a slow machine's timeout is noise.
                &[("FLOODGATE_REDIS_COMMAND_TIMEOUT_MS", "2000")],
            )
        };
        let servers = [serve(), serve()];
        let answers = Arc::new(Mutex::new(Vec::new()));
        let generation = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let all: Vec<Counter> = counters().collect();
        let mut clients = Vec::new();
        for client in 0..CLIENTS {
            let address = format!("http://{}", servers[client % 2].grpc_addr);
            let (answers, generation, stop) = (answers.clone(), generation.clone(), stop.clone());
            let all = all.clone();
            clients.push(tokio::spawn(async move {
                let mut grpc = RateLimitServiceClient::connect(address)
                    .await
                    .expect("connect to floodgate");
                let mut next = client;
                while !stop.load(Ordering::Relaxed) {
                    let generation = generation.load(Ordering::Relaxed);
                    let counter = all[next % all.len()];
                    next += CLIENTS;
                    let sent = Instant::now();
                    let outcome = match grpc.should_rate_limit(ask(generation, counter)).await {
                        Ok(response) => match response.into_inner().overall_code {
                            OK => Outcome::Admitted,
                            OVER_LIMIT => Outcome::Rejected,
                            other => Outcome::Failed(format!("overall code {other}")),
                        },
                        Err(status) => Outcome::Failed(status.message().to_owned()),
                    };
                    let failed = matches!(outcome, Outcome::Failed(_));
                    let answer = Answer {
                        generation,
                        counter,
                        sent,
                        answered: Instant::now(),
                        outcome,
                    };
                    answers.lock().expect("not poisoned").push(answer);
                    if failed {
                        // Failures come at once; a client that does not pause would starve
                        // the two cores of everything else.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }));
        }
        let traffic = Traffic {
            _servers: servers,
            answers,
            generation,
            stop,
            clients,
        };
        traffic.move_on_when_exhausted();
        traffic
    }

    /// Moves the clients to the next generation whenever every counter of the current one
    /// has rejected a hit (a background thread, until the traffic stops).
    fn move_on_when_exhausted(&self) {
        let (answers, generation, stop) = (
            self.answers.clone(),
            self.generation.clone(),
            self.stop.clone(),
        );
        std::thread::spawn(move || {
            let mut seen = 0;
            let mut exhausted = BTreeSet::new();
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
                let current = generation.load(Ordering::Relaxed);
                let answers = answers.lock().expect("not poisoned");
                // Empty once the traffic finished and took them.
                for answer in answers.get(seen..).unwrap_or_default() {
                    if answer.generation == current && answer.outcome == Outcome::Rejected {
                        exhausted.insert(answer.counter);
                    }
                }
                seen = answers.len();
                if exhausted.len() == ALGORITHMS.len() * PER_ALGORITHM {
                    exhausted.clear();
                    generation.store(current + 1, Ordering::Relaxed);
                }
            }
        });
    }

    pub fn answered(&self) -> usize {
        self.answers.lock().expect("not poisoned").len()
    }

    /// The answers of `range` (from [`during`](Self::during)).
    pub fn answers_in(&self, range: std::ops::Range<usize>) -> Vec<Answer> {
        self.answers.lock().expect("not poisoned")[range].to_vec()
    }

    /// Lets the clients run until `count` more answers came in (bounded).
    pub async fn run_for_answers(&self, count: usize) {
        let target = self.answered() + count;
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.answered() < target {
            assert!(
                Instant::now() < deadline,
                "the clients got {} answers of {target} in 120 s",
                self.answered()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Runs `change` (the harness's blocking calls) on a thread of its own while the clients
    /// go on; the answers sent meanwhile.
    pub async fn during<D: Send + 'static, T: Send + 'static>(
        &self,
        deployment: Arc<Mutex<D>>,
        change: impl FnOnce(&mut D) -> T + Send + 'static,
    ) -> (T, std::ops::Range<usize>) {
        let from = self.answered();
        let result = tokio::task::spawn_blocking(move || {
            change(&mut deployment.lock().expect("not poisoned"))
        })
        .await
        .expect("the change ran");
        (result, from..self.answered())
    }

    /// Stops the clients once the current generation is exhausted, so every generation's
    /// counts are complete; every answer.
    pub async fn finish(mut self) -> Vec<Answer> {
        let last = self.generation.load(Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.generation.load(Ordering::Relaxed) == last {
            if Instant::now() > deadline {
                panic!(
                    "generation {last} was not exhausted within 120 s: {}",
                    self.unexhausted(last)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.stop.store(true, Ordering::Relaxed);
        for client in std::mem::take(&mut self.clients) {
            client.await.expect("client task");
        }
        let answers = std::mem::take(&mut *self.answers.lock().expect("not poisoned"));
        // Only generations the clients finished: the one begun at the end is cut short.
        let finished = self.generation.load(Ordering::Relaxed);
        answers
            .into_iter()
            .filter(|answer| answer.generation < finished)
            .collect()
    }
}

impl Traffic {
    /// The counters of `generation` that have not rejected a hit yet, each with its last
    /// answer, and the end of each server's log: why a generation is not exhausted.
    fn unexhausted(&self, generation: usize) -> String {
        let answers = self.answers.lock().expect("not poisoned");
        let mut last = BTreeMap::new();
        let mut rejected = BTreeSet::new();
        for answer in answers
            .iter()
            .filter(|answer| answer.generation == generation)
        {
            if answer.outcome == Outcome::Rejected {
                rejected.insert(answer.counter);
            }
            last.insert(answer.counter, answer.outcome.clone());
        }
        let waiting: Vec<String> = counters()
            .filter(|counter| !rejected.contains(counter))
            .map(|counter| {
                let name = format!("{}={}", ALGORITHMS[counter.0], value(generation, counter));
                format!("{name}: {:?}", last.get(&counter))
            })
            .collect();
        let logs: Vec<String> = (self._servers.iter())
            .map(|server| {
                let log = server.stderr();
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            })
            .collect();
        format!(
            "{} counters waiting, {:?}\n--- server logs ---\n{}",
            waiting.len(),
            &waiting[..waiting.len().min(10)],
            logs.join("\n---\n")
        )
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// What one stretch of answers came to.
#[derive(Debug, Default)]
pub struct Tally {
    pub answers: usize,
    pub failed: usize,
}

pub fn tally(answers: &[Answer]) -> Tally {
    Tally {
        answers: answers.len(),
        failed: (answers.iter())
            .filter(|answer| matches!(answer.outcome, Outcome::Failed(_)))
            .count(),
    }
}

/// Per counter of every generation: how many hits it admitted and how many failed.
pub fn admissions(answers: &[Answer]) -> BTreeMap<(usize, Counter), (usize, usize)> {
    let mut counts = BTreeMap::new();
    for answer in answers {
        let entry: &mut (usize, usize) = counts
            .entry((answer.generation, answer.counter))
            .or_default();
        match answer.outcome {
            Outcome::Admitted => entry.0 += 1,
            Outcome::Rejected => {}
            Outcome::Failed(_) => entry.1 += 1,
        }
    }
    counts
}

/// Every counter admitted exactly its limit, where `over(counter)` allows some more (hits a
/// lost primary had not replicated) and each failed answer some fewer (a call that failed
/// after it was sent may have counted).
pub fn assert_exact(answers: &[Answer], over: impl Fn(usize, Counter) -> usize) {
    let mut wrong = Vec::new();
    for ((generation, counter), (admitted, failed)) in admissions(answers) {
        let most = LIMIT + over(generation, counter);
        let least = LIMIT.saturating_sub(failed);
        if admitted > most || admitted < least {
            let name = format!("{}={}", ALGORITHMS[counter.0], value(generation, counter));
            wrong.push(format!("{name}: {admitted} admitted, {failed} failed"));
        }
    }
    assert!(
        wrong.is_empty(),
        "counters off their limit of {LIMIT}: {wrong:?}"
    );
}

/// Why the failed answers among `answers` failed, each reason once.
pub fn reasons(answers: &[Answer]) -> BTreeSet<&str> {
    (answers.iter())
        .filter_map(|answer| match &answer.outcome {
            Outcome::Failed(why) => Some(why.as_str()),
            _ => None,
        })
        .collect()
}
