//! The lane's queue through a fake link: the one seam a unit test may fake (the integration
//! tests run real Redis). The fake answers the calls the way the script's reply layout says
//! (`lua/README.md`), records every call's keys, and does what a test scripts for its next
//! call: hold it until released, answer that it ran late, forget the script, break, or
//! answer nonsense. Every wait is on an event, never on a sleep.

use std::collections::VecDeque;
use std::sync::atomic::AtomicUsize;
use std::time::{SystemTime, UNIX_EPOCH};

use futures_util::FutureExt;
use tokio::sync::watch;

use super::*;
use crate::clock::SystemClock;
use crate::limiter::{Hits, Limit, Unit};

/// Long enough for any wait of these tests on a busy machine; an event ends each one.
const PATIENCE: Duration = Duration::from_secs(10);

/// What the fake does with the next script call.
enum Step {
    /// Waits until the sender is dropped or sends, then answers.
    Hold(oneshot::Receiver<()>),
    /// Waits as `Hold`, then answers that the call ran past its deadline.
    HoldThenLate(oneshot::Receiver<()>),
    /// Answers that the call ran past its deadline.
    Late,
    /// Answers NOSCRIPT, as a server that lost its scripts.
    NoScript,
    /// Fails the exchange, as a connection that broke.
    Break,
    /// Answers something the script never does.
    Nonsense,
}

/// A Redis the tests script. A hit on the key `k<N>` is allowed with `N` remaining.
#[derive(Default)]
struct Fake {
    steps: Mutex<VecDeque<Step>>,
    /// The keys of every script call received, in the order sent.
    calls: Mutex<Vec<Vec<String>>>,
    /// How many calls were received, for a test to wait on.
    received: OnceLock<watch::Sender<usize>>,
    loads: AtomicUsize,
    resets: AtomicUsize,
}

impl Fake {
    fn then(&self, step: Step) {
        lock(&self.steps).push_back(step);
    }

    /// Holds the next call until the returned sender sends (or is dropped).
    fn hold(&self) -> oneshot::Sender<()> {
        let (release, held) = oneshot::channel();
        self.then(Step::Hold(held));
        release
    }

    fn counter(&self) -> &watch::Sender<usize> {
        self.received.get_or_init(|| watch::channel(0).0)
    }

    /// Waits until `count` calls were received.
    async fn received(&self, count: usize) {
        let mut calls = self.counter().subscribe();
        let reached = calls.wait_for(|&received| received >= count);
        timeout(PATIENCE, reached)
            .await
            .expect("the call comes")
            .expect("the fake lives");
    }

    fn calls(&self) -> Vec<Vec<String>> {
        lock(&self.calls).clone()
    }

    async fn answer(&self, command: &redis::Cmd) -> Result<redis::Value, BackendError> {
        let args: Vec<String> = (command.args_iter())
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => String::new(),
            })
            .collect();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970");
        if args[0] == "TIME" {
            let [seconds, micros] = [now.as_secs(), u64::from(now.subsec_micros())];
            return Ok(redis::Value::Array(vec![
                redis::Value::BulkString(seconds.to_string().into_bytes()),
                redis::Value::BulkString(micros.to_string().into_bytes()),
            ]));
        }
        assert_eq!(args[0], "EVALSHA", "{args:?}");
        let sections = sections(&args);
        let keys = sections.iter().flat_map(|(_, keys)| keys.clone()).collect();
        lock(&self.calls).push(keys);
        self.counter().send_modify(|received| *received += 1);
        let step = lock(&self.steps).pop_front();
        let late = match step {
            Some(Step::Hold(release)) => {
                let _ = release.await;
                false
            }
            Some(Step::HoldThenLate(release)) => {
                let _ = release.await;
                true
            }
            Some(Step::Late) => true,
            Some(Step::NoScript) => {
                let reply = redis::parse_redis_value(b"-NOSCRIPT No matching script.\r\n");
                return Ok(reply.expect("a RESP error"));
            }
            Some(Step::Break) => return Err(BackendError::Unavailable("connection reset".into())),
            Some(Step::Nonsense) => return Ok(redis::Value::Nil),
            None => false,
        };
        let now = redis::Value::Int(i64::try_from(now.as_micros()).expect("µs fit"));
        if late {
            return Ok(redis::Value::Array(vec![
                now,
                redis::Value::BulkString(b"late".to_vec()),
            ]));
        }
        let mut reply = vec![now.clone(), now];
        for (all, keys) in sections {
            if all {
                reply.push(redis::Value::Int(1));
            }
            for key in keys {
                let remaining: i64 = key[1..].parse().expect("a key k<N>");
                reply.extend([redis::Value::Int(remaining + 1), redis::Value::Int(0)]);
            }
        }
        Ok(redis::Value::Array(reply))
    }
}

/// A batch call's sections, in the order sent and answered: whether each is an
/// all-or-nothing group, and its keys (the layout of `lua/README.md`).
fn sections(args: &[String]) -> Vec<(bool, Vec<String>)> {
    let number = |at: usize| -> usize { args[at].parse().expect("a count") };
    // EVALSHA, the SHA1, the declared keys, the clock, the deadline, then the limits.
    let limits_at = 3 + number(2) + 2;
    let mut at = limits_at + 1 + 10 * number(limits_at);
    let mut sections = Vec::new();
    while at < args.len() {
        let count = number(at + 1);
        if args[at] == "each" {
            sections.push((false, args[at + 4..at + 4 + count].to_vec()));
            at += 4 + count;
        } else if args[at] == "costs" {
            let keys = (0..count).map(|hit| args[at + 4 + 2 * hit].clone());
            sections.push((false, keys.collect()));
            at += 3 + 2 * count;
        } else {
            assert_eq!(args[at], "all", "{args:?}");
            let keys = (0..count).map(|hit| args[at + 2 + 4 * hit].clone());
            sections.push((true, keys.collect()));
            at += 2 + 4 * count;
        }
    }
    sections
}

impl Link for Arc<Fake> {
    fn target(&self) -> Target {
        Target::Server
    }

    fn query<'a>(
        &'a self,
        command: &'a redis::Cmd,
    ) -> BoxFuture<'a, Result<redis::Value, BackendError>> {
        Box::pin(self.answer(command))
    }

    fn load_scripts<'a>(&'a self, _: &'a Scripts) -> BoxFuture<'a, Result<(), BackendError>> {
        self.loads.fetch_add(1, Ordering::Relaxed);
        Box::pin(async { Ok(()) })
    }

    fn reset(&self) {
        self.resets.fetch_add(1, Ordering::Relaxed);
    }

    fn name(&self) -> &str {
        "fake"
    }
}

/// A lane on a fake Redis; calls have a second to start once sent.
fn lane() -> (Arc<Fake>, Lane<Arc<Fake>>) {
    let fake = Arc::new(Fake::default());
    let shared = Arc::new(Shared {
        scripts: Scripts::new(),
        command_timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(1),
        clock: Arc::new(SystemClock),
    });
    let lane = Lane::new(fake.clone(), shared, Arc::new(RedisClock::new()));
    (fake, lane)
}

/// One hit on each of `keys`.
fn hits(keys: &[&str]) -> Vec<RedisHit> {
    (keys.iter())
        .map(|key| RedisHit {
            key: (*key).to_owned(),
            limit: Limit::per(100, Unit::Second),
            hits: Hits::take(1),
            binding: true,
        })
        .collect()
}

/// A request for one hit on each of `keys`, in `lane`'s queue: its first poll put it there.
fn queued<'a>(
    lane: &'a Lane<Arc<Fake>>,
    keys: &[&str],
    mode: Mode,
    deadline: Instant,
) -> BoxFuture<'a, Vec<Result<Decision, BackendError>>> {
    let mut request = lane.decide(hits(keys), mode, deadline).boxed();
    assert!(request.as_mut().now_or_never().is_none(), "{keys:?} waits");
    request
}

fn later() -> Instant {
    Instant::now() + PATIENCE
}

/// The remaining quota of each result, or the error.
fn remaining(results: &[Result<Decision, BackendError>]) -> Vec<Result<u64, BackendError>> {
    (results.iter())
        .map(|result| result.clone().map(|decision| decision.remaining))
        .collect()
}

#[tokio::test]
async fn requests_that_come_while_a_call_is_out_go_together_in_the_next_one_each_with_its_results()
{
    let (fake, lane) = lane();
    let release = fake.hold();
    let first = queued(&lane, &["k1"], Mode::Each, later());
    fake.received(1).await;
    // Queued while the first call is out: the first poll puts each in the lane's queue.
    let second = queued(&lane, &["k2", "k3"], Mode::Each, later());
    let third = queued(&lane, &["k4"], Mode::AllOrNothing, later());
    let fourth = queued(&lane, &["k5"], Mode::Each, later());
    release.send(()).expect("the call waits");

    let (first, second, third, fourth) = tokio::join!(first, second, third, fourth);
    assert_eq!(remaining(&first), [Ok(1)]);
    assert_eq!(remaining(&second), [Ok(2), Ok(3)]);
    assert_eq!(remaining(&third), [Ok(4)]);
    assert_eq!(remaining(&fourth), [Ok(5)]);
    assert_eq!(fake.calls(), [vec!["k1"], vec!["k2", "k3", "k4", "k5"]]);
}

#[tokio::test]
async fn a_request_whose_wait_ends_before_its_call_is_sent_says_so_and_is_never_sent() {
    let (fake, lane) = lane();
    let release = fake.hold();
    let first = queued(&lane, &["k1"], Mode::Each, later());
    fake.received(1).await;
    let wait = Duration::from_millis(20);
    let gave_up = lane.decide(hits(&["k2"]), Mode::Each, Instant::now() + wait);
    let gave_up = gave_up.await;
    assert!(
        matches!(gave_up[..], [Err(BackendError::Unsent { .. })]),
        "{gave_up:?}"
    );
    release.send(()).expect("the call waits");
    assert_eq!(remaining(&first.await), [Ok(1)]);
    let next = lane.decide(hits(&["k3"]), Mode::Each, later()).await;
    assert_eq!(remaining(&next), [Ok(3)]);
    assert_eq!(fake.calls(), [vec!["k1"], vec!["k3"]]);
}

#[tokio::test]
async fn a_request_past_the_room_redis_answers_in_time_is_shed_before_it_waits() {
    let (fake, lane) = lane();
    let release = fake.hold();
    let first = queued(&lane, &["k1"], Mode::Each, later());
    fake.received(1).await;
    let many: Vec<String> = (0..4096).map(|n| format!("k{n}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let shed = lane.decide(hits(&many), Mode::Each, later()).await;
    assert_eq!(shed.len(), 4096);
    assert!(
        (shed.iter()).all(|result| matches!(result, Err(BackendError::Overloaded(_)))),
        "{:?}",
        shed[0]
    );
    release.send(()).expect("the call waits");
    assert_eq!(remaining(&first.await), [Ok(1)]);
    assert_eq!(fake.calls(), [vec!["k1"]]);
}

#[tokio::test]
async fn a_lost_script_is_loaded_again_and_the_same_call_sent_once_more() {
    let (fake, lane) = lane();
    fake.then(Step::NoScript);
    let results = lane.decide(hits(&["k7"]), Mode::Each, later()).await;
    assert_eq!(remaining(&results), [Ok(7)]);
    assert_eq!(fake.calls(), [vec!["k7"], vec!["k7"]]);
    // Once when the connection was prepared, once after NOSCRIPT.
    assert_eq!(fake.loads.load(Ordering::Relaxed), 2);
    assert_eq!(fake.resets.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn a_call_redis_ran_too_late_goes_again_with_the_requests_that_still_have_time() {
    let (fake, lane) = lane();
    // A first call out, so that the next two requests leave together.
    let release_first = fake.hold();
    let first = queued(&lane, &["k1"], Mode::Each, later());
    fake.received(1).await;
    let (release_late, late_held) = oneshot::channel();
    fake.then(Step::HoldThenLate(late_held));
    let patient = queued(&lane, &["k2"], Mode::Each, later());
    let hurried = queued(&lane, &["k3"], Mode::Each, Instant::now() + PATIENCE / 5);
    release_first.send(()).expect("the call waits");
    fake.received(2).await;
    // The hurried request stops waiting while its call is out: it may have been counted.
    let gave_up = hurried.await;
    assert!(
        matches!(
            gave_up[..],
            [Err(BackendError::Busy(_) | BackendError::Timeout(_))]
        ),
        "{gave_up:?}"
    );
    release_late.send(()).expect("the call waits");
    assert_eq!(remaining(&patient.await), [Ok(2)]);
    assert_eq!(remaining(&first.await), [Ok(1)]);
    // Redis ran the second call too late, so it decided nothing: the patient request went
    // again, alone.
    assert_eq!(fake.calls(), [vec!["k1"], vec!["k2", "k3"], vec!["k2"]]);
}

#[tokio::test]
async fn a_broken_exchange_drops_the_connection_and_the_next_call_prepares_another() {
    let (fake, lane) = lane();
    fake.then(Step::Break);
    let broken = lane.decide(hits(&["k1"]), Mode::Each, later()).await;
    assert!(
        matches!(&broken[..], [Err(BackendError::Unavailable(why))] if why == "connection reset"),
        "{broken:?}"
    );
    assert_eq!(fake.resets.load(Ordering::Relaxed), 1);
    let next = lane.decide(hits(&["k2"]), Mode::Each, later()).await;
    assert_eq!(remaining(&next), [Ok(2)]);
    assert_eq!(fake.loads.load(Ordering::Relaxed), 2, "prepared anew");
}

#[tokio::test]
async fn a_reply_that_is_no_answer_fails_its_hits_and_keeps_the_connection() {
    let (fake, lane) = lane();
    fake.then(Step::Nonsense);
    let failed = lane.decide(hits(&["k1", "k2"]), Mode::Each, later()).await;
    assert!(
        (failed.iter()).all(|result| matches!(result, Err(BackendError::Protocol(_)))),
        "{failed:?}"
    );
    let next = lane.decide(hits(&["k3"]), Mode::Each, later()).await;
    assert_eq!(remaining(&next), [Ok(3)]);
    assert_eq!(fake.resets.load(Ordering::Relaxed), 0);
    assert_eq!(fake.loads.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn a_call_redis_ran_too_late_is_sent_again_for_a_request_with_time_left() {
    let (fake, lane) = lane();
    fake.then(Step::Late);
    let results = lane.decide(hits(&["k4"]), Mode::Each, later()).await;
    assert_eq!(remaining(&results), [Ok(4)]);
    assert_eq!(fake.calls(), [vec!["k4"], vec!["k4"]]);
}
