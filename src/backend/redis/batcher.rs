//! One connection's queue: the counter hits of concurrent requests go to Redis together.
//!
//! **Batching.** A request's hits join the connection's queue; a driver task takes everything
//! queued and sends it as one script call (`lua/batch.lua`), which decides every hit in queue
//! order with one `TIME`. One call is outstanding per connection: what arrives while Redis
//! runs it waits for the next. So a call carries one request when the connection is idle and
//! grows with the load, and the cost of a call (its parsing, the Lua entry, the clock, the
//! client's own work per command, the wake-ups on both sides) is shared by more requests the
//! busier Redis is. (Two outstanding calls measured worse: smaller calls, less throughput
//! and more server CPU per decision; docs/decisions.md.)
//!
//! **Overload.** The queue is bounded by [`Capacity`]: a request that would exceed the
//! connection's in-flight limit, or whose deadline is nearer than calls have lately waited,
//! is refused before it waits, with [`BackendError::Overloaded`].
//!
//! **Never counted once answered.** A request that stops waiting (its deadline passed) before
//! its call is sent is left out of the call. A call that is out carries the earliest deadline
//! of its requests, on Redis' clock (`deadline.rs`): if Redis runs it later, it decides
//! nothing, and the requests that still have time go again in a new call. So a request
//! answered by a timeout (and its rule's failure policy) is not counted in Redis as well.
//!
//! **A broken connection** (an exchange error, or a call that got no reply while nothing at
//! all came back on the connection) is [`reset`](Link::reset): a standalone server's is
//! dropped and the next call opens a new one.
//!
//! A lane does not know what it talks to: a [`Link`] sends its calls, to a standalone server
//! (`ServerLink` in `mod.rs`) or to one node of a cluster (`cluster.rs`).

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use deadpool_redis::redis;
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, timeout_at};

use super::deadline::RedisClock;
use super::script::{self, Group, Mode, PlannedHit, ScriptClock, Scripts, Target};
use super::{Results, batch_results, is_noscript, lock};
use crate::backend::BackendError;
use crate::backend::capacity::{Capacity, Refusal};
use crate::clock::Clock;
use crate::limiter::{Decision, Hits, Limit};

/// Script calls outstanding on one connection.
const CALLS_IN_FLIGHT: usize = 1;
/// Requests per script call, so that one call never holds Redis for long.
const REQUESTS_PER_CALL: usize = 256;

/// How a lane reaches the server its calls run on.
pub(super) trait Link: Send + Sync + 'static {
    /// Where the calls run, which decides the keys they declare and how they read them.
    fn target(&self) -> Target;

    /// Sends `command`; an error reply comes back as a value (NOSCRIPT must be told apart),
    /// a failure to exchange it as an error.
    fn query<'a>(
        &'a self,
        command: &'a redis::Cmd,
    ) -> BoxFuture<'a, Result<redis::Value, BackendError>>;

    /// Loads the script on the server.
    fn load_scripts<'a>(&'a self, scripts: &'a Scripts) -> BoxFuture<'a, Result<(), BackendError>>;

    /// The connection looks broken: the next call should not use it.
    fn reset(&self);
}

/// What every lane needs besides its link: the script, the command timeout and the local
/// clock (for calendar windows only).
pub(super) struct Shared {
    pub scripts: Scripts,
    pub command_timeout: Duration,
    pub clock: Arc<dyn Clock>,
}

/// One hit as it waits in the queue: owned, since the driver task sends it.
pub(super) struct QueuedHit {
    pub key: String,
    pub limit: Limit,
    pub hits: Hits,
    pub binding: bool,
}

/// One request's hits, waiting for their call.
struct Request {
    hits: Vec<QueuedHit>,
    mode: Mode,
    admitted: Instant,
    /// When the caller stops waiting and answers the request another way.
    deadline: Instant,
    reply: oneshot::Sender<Vec<Result<Decision, BackendError>>>,
}

/// A connection's queue and its driver.
pub(super) struct Lane<L: Link> {
    state: Arc<LaneState<L>>,
    /// The driver's queue, started by the first request.
    queue: OnceLock<mpsc::UnboundedSender<Request>>,
}

/// What the driver and its calls share.
struct LaneState<L> {
    link: L,
    shared: Arc<Shared>,
    /// The server's clock as this lane's replies show it, for the calls' deadlines.
    redis_clock: Arc<RedisClock>,
    capacity: Capacity,
    /// When a reply last came back on this lane's connection (for telling a dead connection
    /// from a slow Redis).
    last_reply: Mutex<Option<Instant>>,
}

impl<L: Link> Lane<L> {
    /// A lane to the server behind `link`, whose clock `redis_clock` follows (lanes to one
    /// server share it).
    pub fn new(link: L, shared: Arc<Shared>, redis_clock: Arc<RedisClock>) -> Self {
        // Calls should wait no more than half the timeout, so the ones Redis decides are
        // answered within it even when the wait doubles before the limit catches up.
        let target = shared.command_timeout / 2;
        Lane {
            state: Arc::new(LaneState {
                link,
                shared,
                redis_clock,
                capacity: Capacity::new(target),
                last_reply: Mutex::new(None),
            }),
            queue: OnceLock::new(),
        }
    }

    /// Decides `hits` (each on its own, or all or nothing) by `deadline`: queued for the
    /// next call, or refused at once when the connection is at capacity.
    pub async fn decide(
        &self,
        hits: Vec<QueuedHit>,
        mode: Mode,
        deadline: Instant,
    ) -> Vec<Result<Decision, BackendError>> {
        let count = hits.len();
        let now = Instant::now();
        if let Err(refusal) = self.state.capacity.admit(count, now, deadline) {
            let why = match refusal {
                Refusal::Full => "redis has as many hits in flight as it answers in time",
                Refusal::TooLate => "the deadline is nearer than the current wait for redis",
            };
            return vec![Err(BackendError::Overloaded(why)); count];
        }
        let (reply, answer) = oneshot::channel();
        let request = Request {
            hits,
            mode,
            admitted: now,
            deadline,
            reply,
        };
        if let Err(unsent) = self.queue().send(request) {
            self.state.capacity.release(count);
            drop(unsent);
            return vec![Err(BackendError::Unavailable("redis driver stopped".into())); count];
        }
        let timeout = deadline.saturating_duration_since(now);
        match timeout_at(deadline, answer).await {
            Ok(Ok(results)) => results,
            Ok(Err(_)) => vec![Err(BackendError::Unavailable("redis call dropped".into())); count],
            Err(_) => vec![Err(BackendError::Timeout(timeout)); count],
        }
    }

    /// Loads the script through this lane's connection (at start-up, and as the breaker's
    /// probe); a failure resets the connection.
    pub async fn load_scripts(&self) -> Result<(), BackendError> {
        let state = &self.state;
        let result = state.link.load_scripts(&state.shared.scripts).await;
        if result.is_err() {
            state.link.reset();
        }
        result
    }

    /// One command on this lane's connection, outside the batched calls (admin work).
    pub async fn query(&self, command: &redis::Cmd) -> Result<redis::Value, BackendError> {
        self.state.link.query(command).await
    }

    /// The local instant `at` on the server's clock, as far as this lane knows it.
    pub fn redis_time_at(&self, at: Instant) -> Option<u64> {
        self.state.redis_clock.redis_time_at(at)
    }

    fn queue(&self) -> &mpsc::UnboundedSender<Request> {
        self.queue.get_or_init(|| {
            let (sender, receiver) = mpsc::unbounded_channel();
            tokio::spawn(drive(self.state.clone(), receiver));
            sender
        })
    }
}

/// Takes what is queued, a call at a time, keeping [`CALLS_IN_FLIGHT`] calls outstanding.
async fn drive<L: Link>(state: Arc<LaneState<L>>, mut queue: mpsc::UnboundedReceiver<Request>) {
    let mut calls = FuturesUnordered::new();
    let mut taken = Vec::with_capacity(REQUESTS_PER_CALL);
    loop {
        tokio::select! {
            biased;
            Some(()) = calls.next(), if !calls.is_empty() => {}
            received = queue.recv_many(&mut taken, REQUESTS_PER_CALL),
                if calls.len() < CALLS_IN_FLIGHT =>
            {
                if received == 0 {
                    break;
                }
                let mut requests = std::mem::take(&mut taken);
                // Requests whose caller stopped waiting are not sent: they were answered
                // another way, and must not be counted now.
                requests.retain(|request| {
                    let waiting = !request.reply.is_closed();
                    if !waiting {
                        state.capacity.release(request.hits.len());
                    }
                    waiting
                });
                if !requests.is_empty() {
                    calls.push(call(state.clone(), requests));
                }
            }
        }
    }
    while calls.next().await.is_some() {}
}

/// One script call for `requests` (more if Redis runs it too late for some of them),
/// bounded by the command timeout from when it is sent (no request waits longer than that);
/// each request gets its results, and its room in the lane back.
async fn call<L: Link>(state: Arc<LaneState<L>>, mut requests: Vec<Request>) {
    let oldest = requests.iter().map(|r| r.admitted).min();
    let sent = Instant::now();
    let bound = sent + state.shared.command_timeout;
    let outcome = timeout_at(bound, exchange_in_time(&state, &mut requests)).await;
    let now = Instant::now();
    let hits: usize = requests.iter().map(|r| r.hits.len()).sum();
    let results: Vec<Vec<Result<Decision, BackendError>>> = match outcome {
        Ok(Ok(results)) => {
            let waited = now.saturating_duration_since(oldest.unwrap_or(sent));
            state.capacity.answered(hits, waited, now);
            results
        }
        Ok(Err(error)) => {
            // Possibly a dead socket: the next call opens a new connection.
            state.link.reset();
            requests
                .iter()
                .map(|r| vec![Err(error.clone()); r.hits.len()])
                .collect()
        }
        Err(_) => {
            // Nothing came back on this connection since the call went out: it may be dead
            // (a partition) rather than slow; the next call opens a new one.
            if lock(&state.last_reply).is_none_or(|at| at < sent) {
                state.link.reset();
            }
            requests.iter().map(|r| timed_out(&state, r)).collect()
        }
    };
    state.capacity.release(hits);
    for (request, results) in requests.into_iter().zip(results) {
        // A caller that stopped waiting has its answer already.
        let _ = request.reply.send(results);
    }
}

/// Sends `requests` in one call with the earliest of their deadlines, and again, with those
/// that still have time, for as long as Redis runs the call too late; the requests whose
/// deadline passed meanwhile are answered (timed out) and leave `requests`. The results are
/// those of the requests that stay, in order.
async fn exchange_in_time<L: Link>(
    state: &LaneState<L>,
    requests: &mut Vec<Request>,
) -> Result<Vec<Vec<Result<Decision, BackendError>>>, BackendError> {
    if !state.redis_clock.knows_offset() {
        // The lane's first call (or its server's clock was never read): one round trip
        // more, once, so that no call goes out without a deadline.
        read_redis_clock(state).await?;
    }
    loop {
        let Some(earliest) = requests.iter().map(|r| r.deadline).min() else {
            return Ok(Vec::new());
        };
        let deadline = state.redis_clock.redis_time_at(earliest);
        if let Some(results) = exchange(state, requests, deadline).await? {
            return Ok(results);
        }
        let now = Instant::now();
        let (waiting, late): (Vec<Request>, Vec<Request>) = std::mem::take(requests)
            .into_iter()
            .partition(|r| r.deadline > now && !r.reply.is_closed());
        for request in late {
            state.capacity.release(request.hits.len());
            let answer = timed_out(state, &request);
            let _ = request.reply.send(answer);
        }
        *requests = waiting;
    }
}

/// One sample of the server's clock: `TIME`. A connection that fails fails the call; an
/// error reply only leaves this call without a deadline (the script reads `TIME` itself, so
/// its reply gives the next call one).
async fn read_redis_clock<L: Link>(state: &LaneState<L>) -> Result<(), BackendError> {
    let reply = state.link.query(&redis::cmd("TIME")).await?;
    let received = Instant::now();
    match redis::from_redis_value::<(u64, u64)>(reply) {
        Ok((seconds, micros)) => {
            let now = seconds.saturating_mul(1_000_000).saturating_add(micros);
            state.redis_clock.observe(now, received);
        }
        Err(error) => tracing::debug!(%error, "redis TIME failed; this call has no deadline"),
    }
    Ok(())
}

/// A timeout for each of `request`'s hits.
fn timed_out<L>(state: &LaneState<L>, request: &Request) -> Vec<Result<Decision, BackendError>> {
    let timeout = state.shared.command_timeout;
    vec![Err(BackendError::Timeout(timeout)); request.hits.len()]
}

/// Sends one script call for `requests` on the lane's connection (once more after loading
/// the script if the server had lost it) and splits its results by request; `None` when
/// Redis ran it past `deadline` (its clock, µs) and it decided nothing.
async fn exchange<L: Link>(
    state: &LaneState<L>,
    requests: &[Request],
    deadline: Option<u64>,
) -> Result<Option<Vec<Vec<Result<Decision, BackendError>>>>, BackendError> {
    let shared = &state.shared;
    let planned: Vec<Vec<PlannedHit<'_>>> = requests
        .iter()
        .map(|request| {
            (request.hits.iter())
                .map(|hit| PlannedHit {
                    key: &hit.key,
                    limit: &hit.limit,
                    hits: hit.hits,
                    binding: hit.binding,
                })
                .collect()
        })
        .collect();
    let groups: Vec<Group<'_>> = (requests.iter().zip(&planned))
        .map(|(request, hits)| Group {
            mode: request.mode,
            hits,
        })
        .collect();
    let local_now = shared.clock.now_micros();
    let command = script::batch_call(
        &shared.scripts,
        &groups,
        state.link.target(),
        ScriptClock::Redis,
        deadline,
        local_now,
    );
    let mut reply = state.link.query(&command).await?;
    if is_noscript(&reply) {
        tracing::info!("redis lost its script; loading it again");
        state.link.load_scripts(&shared.scripts).await?;
        reply = state.link.query(&command).await?;
    }
    let received = Instant::now();
    *lock(&state.last_reply) = Some(received);
    let results = match batch_results(&reply, &groups) {
        Results::Late { ran_at } => {
            state.redis_clock.observe(ran_at, received);
            return Ok(None);
        }
        Results::Hits { ran_at, hits } => {
            if let Some(ran_at) = ran_at {
                state.redis_clock.observe(ran_at, received);
            }
            hits
        }
    };
    let mut results = results.into_iter();
    Ok(Some(
        requests
            .iter()
            .map(|request| results.by_ref().take(request.hits.len()).collect())
            .collect(),
    ))
}
