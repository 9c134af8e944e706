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
//! **Pipelining when the way is long.** On a Redis whose round trip is a quarter of the
//! command timeout or more, a request whose deadline is nearer than two of the connection's
//! quickest round trips cannot afford to wait for the call ahead and then for its own: it
//! goes at once, in a call beside the ones out (at most [`MAX_CALLS_IN_FLIGHT`]). There the
//! connection carries several calls at once; on a near Redis, one.
//!
//! **Overload.** The queue is bounded by [`Capacity`]: a request that would exceed the
//! connection's in-flight limit (which follows how long Redis itself takes with the calls),
//! or whose deadline is nearer than calls have lately waited, is refused before it waits,
//! with [`BackendError::Overloaded`].
//!
//! **Two bounds.** A request waits for its turn until its own deadline (80% of the caller's,
//! or `redis_max_wait_ms` from its start if sooner: the service sets it); a call, once sent,
//! must be started by Redis within the command timeout. So a server that is slow to get to
//! its requests (short of CPU) does not fail them while Redis answers in time, and a Redis
//! that stalls costs each request at most its wait. A request whose wait ends before its call
//! was sent is never sent afterwards ([`Turn`]), and says so: nothing was counted.
//!
//! **Too far.** A Redis whose quickest round trip lately is above the command timeout cannot
//! answer any call in time: requests are answered at once ([`BackendError::TooFar`]), and a
//! `TIME` measures the way again every [`FAR_PROBE_INTERVAL`] until it is near enough.
//!
//! **Never counted once answered.** A request that stops waiting (its deadline passed) before
//! its call is sent is left out of the call. A call that is out carries the earliest deadline
//! of its requests (or its own bound, if sooner), on Redis' clock (`deadline.rs`): if Redis
//! runs it later, it decides nothing, and the requests that still have time go again in a new
//! call. So a request answered by a timeout (and its rule's failure policy) is not counted in
//! Redis as well.
//!
//! **Replies are read on a thread of their own** ([`redis_io`]): the drivers, connection
//! set-up and probes run there, so a server busy with requests (a storm of refusals at
//! overload) still reads a verdict Redis gave in time before its requests' deadlines.
//!
//! **Connections are prepared off the request path.** Opening a connection, loading the
//! script and (once per server) reading its clock run in a task of their own, which no
//! request's deadline cancels: a Redis a few milliseconds away, where those round trips add
//! up to more than a timeout, is still connected, and requests wait for it only as long as
//! their own deadline allows.
//!
//! **A connection that answers is kept.** A call that runs out of time leaves its reply to
//! come: the connection reads and discards it when it does. Only a connection that fails an
//! exchange, or has answered nothing at all for [`SILENCE`] (at least four times the command
//! timeout) while calls were waiting, is [`reset`](Link::reset) and prepared anew.
//!
//! A lane does not know what it talks to: a [`Link`] sends its calls, to a standalone server
//! (`ServerLink` in `mod.rs`) or to one node of a cluster (`cluster.rs`).

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use deadpool_redis::redis;
use futures_util::StreamExt;
use futures_util::future::{BoxFuture, FutureExt, Shared as SharedFuture};
use futures_util::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, timeout, timeout_at};

use super::capacity::{CallTimes, Capacity, ShedReason};
use super::deadline::{EPOCH, RedisClock};
use super::recent::RecentLeast;
use super::script::{self, Answer, Group, Mode, RanAt, RedisHit, ScriptClock, Scripts, Target};
use super::{is_noscript, lock};
use crate::backend::BackendError;
use crate::clock::Clock;
use crate::limiter::Decision;

/// The most script calls outstanding on one connection: one, unless requests cannot afford
/// to wait for the call ahead ([`drive`]). Enough for a Redis 10 ms away at thousands of
/// calls a second.
const MAX_CALLS_IN_FLIGHT: usize = 64;
/// Requests per script call, so that one call never holds Redis for long.
const REQUESTS_PER_CALL: usize = 256;
/// How long a connection may answer nothing while calls wait before it counts as dead (or
/// four times the command timeout, if longer: a Redis busy with another client's slow
/// command answers within that): a partition or a stopped server, not a slow one.
const SILENCE: Duration = Duration::from_millis(100);
/// How often a lane too far for the command timeout measures the round trip again (a
/// `TIME`), to learn when Redis is near enough to call.
const FAR_PROBE_INTERVAL: Duration = Duration::from_millis(200);
/// The round trips a lane must have measured before it finds Redis too far: one slow sample
/// (a busy machine, a Redis just started) is one unlucky moment, not a distance.
const FAR_SAMPLES: u64 = 4;

/// The runtime every lane's driver, connection set-up and replies run on: one thread of its
/// own, so that a server busy with requests (a storm of refusals at overload) still reads
/// Redis' replies as they come, instead of after its requests' deadlines. It sleeps between
/// replies, and the system's scheduler wakes such a thread ahead of busy ones.
fn redis_io() -> &'static tokio::runtime::Handle {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("floodgate-redis")
                .enable_all()
                .build()
                .expect("a runtime for redis i/o")
        })
        .handle()
}

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

    /// The server, for the log: its address, without credentials.
    fn name(&self) -> &str;
}

/// What every lane needs besides its link: the script, the timeouts and the local clock
/// (for calendar windows only).
pub(super) struct Shared {
    pub scripts: Scripts,
    pub command_timeout: Duration,
    /// Bound on preparing a connection: opening it, then a round trip or two.
    pub connect_timeout: Duration,
    pub clock: Arc<dyn Clock>,
}

/// One request's hits, waiting for their call.
struct Request {
    hits: Vec<RedisHit>,
    mode: Mode,
    admitted: Instant,
    /// When the caller stops waiting and answers the request another way.
    deadline: Instant,
    /// Whether the request has gone to Redis, or its caller gave up before it did.
    turn: Arc<Turn>,
    reply: oneshot::Sender<Vec<Result<Decision, BackendError>>>,
}

/// A request's turn, settled once by whichever comes first: its call is sent (the driver),
/// or its caller stops waiting (its deadline). So a caller that gives up knows whether
/// nothing was sent, and a request given up is never sent afterwards.
#[derive(Default)]
struct Turn(AtomicU8);

impl Turn {
    const WAITING: u8 = 0;
    const SENT: u8 = 1;
    const ABANDONED: u8 = 2;

    /// The driver sends the request: `false` if its caller has given up on it.
    fn send(&self) -> bool {
        match (self.0).compare_exchange(
            Self::WAITING,
            Self::SENT,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => true,
            Err(now) => now == Self::SENT,
        }
    }

    /// The caller gives up: `true` if the request was never sent (and now never will be).
    fn abandon(&self) -> bool {
        (self.0)
            .compare_exchange(
                Self::WAITING,
                Self::ABANDONED,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    fn abandoned(&self) -> bool {
        self.0.load(Ordering::Acquire) == Self::ABANDONED
    }
}

/// A connection's queue and its driver.
pub(super) struct Lane<L: Link> {
    state: Arc<LaneState<L>>,
    /// The driver's queue, started by the first request.
    queue: OnceLock<mpsc::UnboundedSender<Request>>,
}

/// The preparation of a connection, shared by every call that waits for it: the number of
/// the connection it prepared.
type Preparation = SharedFuture<BoxFuture<'static, Result<u64, BackendError>>>;

/// Whether the lane's connection is open, with the script loaded and the server's clock read.
/// Each connection prepared gets the next number, so that a call that failed on an old one
/// does not drop its successor.
enum Readiness {
    Unprepared,
    Preparing(Preparation),
    Ready(u64),
}

/// What the driver and its calls share.
struct LaneState<L> {
    link: L,
    shared: Arc<Shared>,
    /// The server's clock as its replies show it, for the calls' deadlines (shared by every
    /// lane to that server).
    redis_clock: Arc<RedisClock>,
    capacity: Capacity,
    readiness: Mutex<Readiness>,
    /// How many connections have been prepared.
    prepared: AtomicU64,
    /// Since when calls on this connection have waited with no reply at all; `None` while it
    /// answers.
    silent_since: Mutex<Option<Instant>>,
    /// When a reply (a verdict, or a call run too late) last came back on this lane.
    last_reply: Mutex<Option<Instant>>,
    /// When the last call Redis decided was answered here, and how long it waited in Redis
    /// before it ran: the requests queued meanwhile waited for it.
    last_call: Mutex<Option<(Instant, Duration)>>,
    /// How late this process has lately read replies, beyond the quickest reply (µs, a
    /// mean over the last ~8): how much earlier than a request's deadline Redis must run
    /// its call for the verdict to reach it in time.
    reading_lag_micros: AtomicU64,
    /// The quickest round trip of a call (or a `TIME`) lately (µs): how long before its
    /// deadline a request must leave, and whether Redis is near enough to call at all.
    quickest_round_trip: RecentLeast,
    /// Whether the lane last found Redis too far to call (logged when it changes).
    too_far: AtomicBool,
    /// When a lane too far last measured the round trip again, and whether a measure is
    /// under way.
    last_far_probe: Mutex<Option<Instant>>,
    probing: AtomicBool,
}

impl<L: Link> Lane<L> {
    /// A lane to the server behind `link`, whose clock `redis_clock` follows (lanes to one
    /// server share it).
    pub fn new(link: L, shared: Arc<Shared>, redis_clock: Arc<RedisClock>) -> Self {
        // A request should wait in Redis' queue (its own call's and the one before's) no
        // longer than the timeout, past which Redis would run its call too late. A stricter
        // target measured worse: on a machine where Redis shares the CPU with a saturated
        // server, Redis' queue holds a few ms of noise that shrank the limit and shed work
        // Redis then had time for (issue 19).
        let target = shared.command_timeout;
        Lane {
            state: Arc::new(LaneState {
                link,
                shared,
                redis_clock,
                capacity: Capacity::new(target),
                readiness: Mutex::new(Readiness::Unprepared),
                prepared: AtomicU64::new(0),
                silent_since: Mutex::new(None),
                last_reply: Mutex::new(None),
                last_call: Mutex::new(None),
                reading_lag_micros: AtomicU64::new(0),
                quickest_round_trip: RecentLeast::new(EPOCH),
                too_far: AtomicBool::new(false),
                last_far_probe: Mutex::new(None),
                probing: AtomicBool::new(false),
            }),
            queue: OnceLock::new(),
        }
    }

    /// Decides `hits` (each on its own, or all or nothing) by `deadline`: queued for the
    /// next call, or refused at once when the connection is at capacity.
    pub async fn decide(
        &self,
        hits: Vec<RedisHit>,
        mode: Mode,
        deadline: Instant,
    ) -> Vec<Result<Decision, BackendError>> {
        let count = hits.len();
        let now = Instant::now();
        if let Some(too_far) = self.state.too_far(now) {
            return vec![Err(too_far); count];
        }
        if let Err(refusal) = self.state.capacity.admit(count, now, deadline) {
            let why = match refusal {
                ShedReason::Full => "redis has as many hits in flight as it answers in time",
                ShedReason::TooLate => "the deadline is nearer than the current wait for redis",
            };
            return vec![Err(BackendError::Overloaded(why)); count];
        }
        let (reply, answer) = oneshot::channel();
        let turn = Arc::new(Turn::default());
        let request = Request {
            hits,
            mode,
            admitted: now,
            deadline,
            turn: turn.clone(),
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
            Err(_) => {
                self.state.capacity.gave_up(timeout);
                // Replies came back meanwhile: Redis is alive, only not done with this request.
                let answering = lock(&self.state.last_reply).is_some_and(|at| at > now);
                let error = if turn.abandon() {
                    BackendError::Unsent {
                        waited: timeout,
                        answering,
                    }
                } else if answering {
                    BackendError::Busy(timeout)
                } else {
                    BackendError::Timeout(timeout)
                };
                vec![Err(error); count]
            }
        }
    }

    /// Loads the script through this lane's connection (the breaker's probe); a failure
    /// resets the connection.
    pub async fn load_scripts(&self) -> Result<(), BackendError> {
        let state = &self.state;
        let on = match *lock(&state.readiness) {
            Readiness::Ready(connection) => Some(connection),
            _ => None,
        };
        let result = state.link.load_scripts(&state.shared.scripts).await;
        if let (Err(_), Some(connection)) = (&result, on) {
            state.drop_connection(connection);
        }
        result
    }

    /// Opens and prepares this lane's connection, if it is not ready yet (at start-up).
    pub async fn prepare(&self) -> Result<(), BackendError> {
        self.state.ready().await.map(drop)
    }

    /// Whether the connection is open and prepared: a request sent here waits for no set-up.
    pub fn is_ready(&self) -> bool {
        matches!(*lock(&self.state.readiness), Readiness::Ready(_))
    }

    /// One command on this lane's connection, outside the batched calls (admin work).
    pub async fn query(&self, command: &redis::Cmd) -> Result<redis::Value, BackendError> {
        self.state.link.query(command).await
    }

    /// The quickest round trip to the server lately; `None` before the first.
    pub fn quickest_round_trip(&self) -> Option<Duration> {
        let micros = self.state.quickest_round_trip.least()?;
        Some(Duration::from_micros(micros.unsigned_abs()))
    }

    /// The local instant `at` on the server's clock, as far as this lane knows it.
    pub fn redis_time_at(&self, at: Instant) -> Option<u64> {
        self.state.redis_clock.redis_time_at(at)
    }

    fn queue(&self) -> &mpsc::UnboundedSender<Request> {
        self.queue.get_or_init(|| {
            let (sender, receiver) = mpsc::unbounded_channel();
            redis_io().spawn(drive(self.state.clone(), receiver));
            sender
        })
    }
}

impl<L: Link> LaneState<L> {
    /// Waits until the connection is prepared, starting the preparation if none is under
    /// way. The preparation runs in a task of its own: a caller that stops waiting leaves it
    /// to finish for the next one. Gives the number of the connection that is ready.
    async fn ready(self: &Arc<Self>) -> Result<u64, BackendError> {
        let preparation = {
            let mut readiness = lock(&self.readiness);
            match &*readiness {
                Readiness::Ready(connection) => return Ok(*connection),
                Readiness::Preparing(preparation) => preparation.clone(),
                Readiness::Unprepared => {
                    let task = redis_io().spawn(self.clone().prepare());
                    let preparation = async move {
                        task.await.unwrap_or_else(|error| {
                            Err(BackendError::NothingCounted(format!(
                                "redis connection set-up failed: {error}"
                            )))
                        })
                    }
                    .boxed()
                    .shared();
                    *readiness = Readiness::Preparing(preparation.clone());
                    preparation
                }
            }
        };
        preparation.await
    }

    /// Opens the connection (the first command does), reads the server's clock if no lane
    /// to it has yet, and loads the script; then marks the lane ready on a connection with a
    /// new number, or unprepared again.
    async fn prepare(self: Arc<Self>) -> Result<u64, BackendError> {
        let bound = self.shared.connect_timeout + 2 * self.shared.command_timeout;
        let steps = async {
            if !self.redis_clock.knows_offset() {
                read_redis_clock(&self).await?;
            }
            self.link.load_scripts(&self.shared.scripts).await
        };
        let result = match timeout(bound, steps).await {
            Ok(result) => result,
            Err(_) => Err(BackendError::NotReady(bound)),
        };
        let mut readiness = lock(&self.readiness);
        match result {
            Ok(()) => {
                let connection = self.prepared.fetch_add(1, Ordering::Relaxed) + 1;
                *readiness = Readiness::Ready(connection);
                *lock(&self.silent_since) = None;
                Ok(connection)
            }
            Err(error) => {
                *readiness = Readiness::Unprepared;
                self.link.reset();
                Err(error)
            }
        }
    }

    /// How long a call waited before Redis ran it, from its send to the script's start, on
    /// Redis' clock.
    fn redis_wait(&self, ran: &Ran) -> Option<Duration> {
        let sent_at = self.redis_clock.redis_time_at(ran.sent)?;
        Some(Duration::from_micros(
            ran.at?.started.saturating_sub(sent_at),
        ))
    }

    /// Whether a round trip is at least a quarter of the command timeout: a request that
    /// waits for the call ahead and then for its own spends half its time or more on the
    /// way, and calls go beside each other. On a near Redis (a round trip of well under a
    /// millisecond) the driver does not watch the queue while its call is out: that would
    /// wake it once per request, for nothing (one run measured 22.6 → 23.8 µs of server
    /// CPU per decision with it, within this machine's run-to-run noise).
    fn far(&self) -> bool {
        let quickest = self.quickest_round_trip.least().unwrap_or(0).unsigned_abs();
        4 * Duration::from_micros(quickest) >= self.shared.command_timeout
    }

    /// Why a request cannot be sent now: the quickest round trip lately (of at least
    /// [`FAR_SAMPLES`]) is above the command timeout, so no call could be answered within
    /// it. While the quickest is above it, a `TIME` measures the way again: at once while
    /// the samples are too few to tell, then every [`FAR_PROBE_INTERVAL`]. A lane that was
    /// near learns it is far once its quicker samples age out (10–20 s); a change either way
    /// is logged.
    fn too_far(self: &Arc<Self>, now: Instant) -> Option<BackendError> {
        let timeout = self.shared.command_timeout;
        let quickest = Duration::from_micros(self.quickest_round_trip.least()?.unsigned_abs());
        if quickest <= timeout {
            self.note_distance(false, quickest);
            return None;
        }
        let confirmed = self.quickest_round_trip.least_of(FAR_SAMPLES).is_some();
        self.probe_round_trip_if_due(now, confirmed);
        if !confirmed {
            return None;
        }
        self.note_distance(true, quickest);
        Some(BackendError::TooFar {
            round_trip: quickest,
            timeout,
        })
    }

    /// Logs a change of whether Redis is too far to call.
    fn note_distance(&self, far: bool, round_trip: Duration) {
        if far == self.too_far.swap(far, Ordering::Relaxed) {
            return;
        }
        let link = self.link.name();
        let round_trip_ms = round_trip.as_secs_f64() * 1e3;
        if far {
            let timeout_ms = self.shared.command_timeout.as_secs_f64() * 1e3;
            tracing::warn!(
                redis = %link,
                round_trip_ms,
                timeout_ms,
                "redis is too far for redis_command_timeout_ms: its quickest round trip lately \
                 is above it, so every request is answered by its rules' on_backend_error at \
                 once until it is nearer; raise redis_command_timeout_ms (and \
                 redis_max_wait_ms) above the round trip to call it"
            );
        } else {
            tracing::info!(
                redis = %link,
                round_trip_ms,
                "redis is near enough for redis_command_timeout_ms again"
            );
        }
    }

    /// Starts a measure of the round trip unless one is under way or (`paced`) the last
    /// began less than [`FAR_PROBE_INTERVAL`] ago.
    fn probe_round_trip_if_due(self: &Arc<Self>, now: Instant, paced: bool) {
        {
            let mut last = lock(&self.last_far_probe);
            let recent =
                last.is_some_and(|at| now.saturating_duration_since(at) < FAR_PROBE_INTERVAL);
            if (paced && recent) || self.probing.swap(true, Ordering::AcqRel) {
                return;
            }
            *last = Some(now);
        }
        redis_io().spawn(self.clone().probe_round_trip());
    }

    /// Measures the round trip once more (a `TIME` on a ready connection), within the
    /// connection's set-up bound; a connection that fails is dropped.
    async fn probe_round_trip(self: Arc<Self>) {
        let bound = self.shared.connect_timeout + self.silence();
        let probe = async {
            let connection = self.ready().await?;
            if let Err(error) = read_redis_clock(&self).await {
                self.drop_connection(connection);
                return Err(error);
            }
            Ok(())
        };
        if let Ok(Err(error)) = timeout(bound, probe).await {
            tracing::debug!(%error, "measuring the round trip to a far redis failed");
        }
        self.probing.store(false, Ordering::Release);
    }

    /// When `waiting` must leave, beside the calls out if need be: two quick round trips
    /// before the earliest deadline, one for the call and one for the link's variance.
    /// `None` before the first reply, or with nothing waiting.
    fn send_by(&self, waiting: &[Request]) -> Option<Instant> {
        let round_trip = Duration::from_micros(self.quickest_round_trip.least()?.unsigned_abs());
        let earliest = waiting.iter().map(|r| r.deadline).min()?;
        Some(earliest.checked_sub(2 * round_trip).unwrap_or(earliest))
    }

    /// How long a connection may answer nothing while a call waits before it counts as dead.
    fn silence(&self) -> Duration {
        SILENCE.max(4 * self.shared.command_timeout)
    }

    /// Takes the lag of a reply the script finished at `finished_at` (Redis' clock) and this
    /// process read at `received`.
    fn note_reading_lag(&self, finished_at: u64, received: Instant) {
        if let Some(lag) = self.redis_clock.lag(finished_at, received) {
            let lag = u64::try_from(lag.as_micros()).unwrap_or(u64::MAX);
            let mean = self.reading_lag_micros.load(Ordering::Relaxed);
            (self.reading_lag_micros).store(mean - mean / 8 + lag / 8, Ordering::Relaxed);
        }
    }

    /// Connection number `connection` looks broken: unless it has been replaced already (the
    /// calls out on it fail together), the next call prepares a new one.
    fn drop_connection(&self, connection: u64) {
        let mut readiness = lock(&self.readiness);
        if matches!(*readiness, Readiness::Ready(current) if current == connection) {
            *readiness = Readiness::Unprepared;
            self.link.reset();
        }
    }

    /// A call sent at `sent` on `connection` ran out of time: the connection is dropped only
    /// if nothing has come back on it for [`SILENCE`] (a reply on its way is read and
    /// discarded when it comes).
    fn timed_out_since(&self, connection: u64, sent: Instant, now: Instant) {
        let silence = self.silence();
        let mut silent_since = lock(&self.silent_since);
        let since = *silent_since.get_or_insert(sent);
        if now.saturating_duration_since(since) >= silence {
            *silent_since = None;
            drop(silent_since);
            self.drop_connection(connection);
        }
    }
}

/// Takes what is queued, a call at a time: what arrives while a call is out waits for it
/// and goes in the next, unless it cannot afford to. On a Redis far away (see
/// [`LaneState::far`]) the queue is watched while calls are out, and a request whose
/// deadline is nearer than two of the lane's quickest round trips goes at once, in a call
/// beside the ones out (up to [`MAX_CALLS_IN_FLIGHT`]): waiting for the call ahead and then
/// for one's own would take longer than it has. On a near Redis the driver sleeps while its
/// call is out, and wakes once for everything that arrived meanwhile.
async fn drive<L: Link>(state: Arc<LaneState<L>>, mut queue: mpsc::UnboundedReceiver<Request>) {
    let mut calls = FuturesUnordered::new();
    let mut waiting: Vec<Request> = Vec::with_capacity(REQUESTS_PER_CALL);
    let mut open = true;
    while open || !waiting.is_empty() || !calls.is_empty() {
        let hurry = (!waiting.is_empty() && calls.len() < MAX_CALLS_IN_FLIGHT)
            .then(|| state.send_by(&waiting))
            .flatten();
        let room = REQUESTS_PER_CALL - waiting.len();
        tokio::select! {
            biased;
            Some(()) = calls.next(), if !calls.is_empty() => {}
            received = queue.recv_many(&mut waiting, room),
                if open && room > 0 && (calls.is_empty() || state.far()) =>
            {
                open = received > 0;
            }
            () = tokio::time::sleep_until(hurry.unwrap_or_else(Instant::now)),
                if hurry.is_some() => {
                dispatch(&state, &mut queue, &mut waiting, &mut calls);
            }
        }
        if calls.is_empty() && !waiting.is_empty() {
            dispatch(&state, &mut queue, &mut waiting, &mut calls);
        }
    }
}

/// Starts a call with everything waiting and whatever else is queued (up to
/// [`REQUESTS_PER_CALL`]), leaving out the requests whose caller stopped waiting: they were
/// answered another way, and must not be counted now.
fn dispatch<L: Link>(
    state: &Arc<LaneState<L>>,
    queue: &mut mpsc::UnboundedReceiver<Request>,
    waiting: &mut Vec<Request>,
    calls: &mut FuturesUnordered<BoxFuture<'static, ()>>,
) {
    while waiting.len() < REQUESTS_PER_CALL {
        match queue.try_recv() {
            Ok(request) => waiting.push(request),
            Err(_) => break,
        }
    }
    let mut requests = std::mem::replace(waiting, Vec::with_capacity(REQUESTS_PER_CALL));
    requests.retain(|request| {
        let answered = request.reply.is_closed() || request.turn.abandoned();
        if answered {
            state.capacity.release(request.hits.len());
        }
        !answered
    });
    if !requests.is_empty() {
        calls.push(call(state.clone(), requests).boxed());
    }
}

/// One script call for `requests` (more if Redis runs it too late for some of them), once
/// the connection is ready: each request gets its results, and its room in the lane back.
async fn call<L: Link>(state: Arc<LaneState<L>>, mut requests: Vec<Request>) {
    let latest = requests.iter().map(|r| r.deadline).max();
    let results = match timeout_at(latest.unwrap_or_else(Instant::now), state.ready()).await {
        Ok(Ok(connection)) => send(&state, connection, &mut requests).await,
        // Nothing was sent: the requests may go again.
        Ok(Err(error)) => answer_all(&requests, |_| error.clone()),
        Err(_) => answer_all(&requests, |request| {
            BackendError::NotReady(request.deadline.saturating_duration_since(request.admitted))
        }),
    };
    // The requests that left on the way (their deadline passed) gave their room back.
    let hits: usize = requests.iter().map(|r| r.hits.len()).sum();
    state.capacity.release(hits);
    for (request, results) in requests.into_iter().zip(results) {
        // A caller that stopped waiting has its answer already.
        let _ = request.reply.send(results);
    }
}

/// Sends the call on connection number `connection` (again, with the requests that still
/// have time, while Redis runs it too late), and reads what it says of the wait into the
/// lane's capacity.
async fn send<L: Link>(
    state: &LaneState<L>,
    connection: u64,
    requests: &mut Vec<Request>,
) -> Vec<Vec<Result<Decision, BackendError>>> {
    let oldest = requests.iter().map(|r| r.admitted).min();
    match exchange_in_time(state, requests).await {
        Ok((results, ran)) => {
            let now = Instant::now();
            let oldest = oldest.unwrap_or(ran.sent);
            let redis_wait = state.redis_wait(&ran);
            let redis_wait_before = {
                let mut last_call = lock(&state.last_call);
                let before = (*last_call)
                    .filter(|&(answered, _)| oldest < answered)
                    .map(|(_, wait)| wait);
                *last_call = redis_wait.map(|wait| (now, wait));
                before
            };
            let times = CallTimes {
                waited: Some(now.saturating_duration_since(oldest)),
                redis_wait,
                redis_wait_before,
            };
            state.capacity.answered(times, now);
            results
        }
        Err(Failure::Broken(error)) => {
            // Possibly a dead socket: the next call opens a new connection.
            state.drop_connection(connection);
            answer_all(requests, |_| error.clone())
        }
        Err(Failure::Unanswered { sent }) => {
            state.timed_out_since(connection, sent, Instant::now());
            requests.iter().map(|r| timed_out(state, r)).collect()
        }
    }
}

/// `error` (made for each request) for every hit of every request.
fn answer_all(
    requests: &[Request],
    error: impl Fn(&Request) -> BackendError,
) -> Vec<Vec<Result<Decision, BackendError>>> {
    (requests.iter())
        .map(|request| vec![Err(error(request)); request.hits.len()])
        .collect()
}

/// When a call that Redis answered went out (locally), and when it finished on Redis' clock
/// (`None` when the reply did not say).
struct Ran {
    sent: Instant,
    at: Option<RanAt>,
}

/// Why a call has no verdict.
enum Failure {
    /// The exchange failed: the connection may be broken.
    Broken(BackendError),
    /// No reply came in time for the call sent at `sent`.
    Unanswered { sent: Instant },
}

/// Sends `requests` in one call. Redis runs it by the earliest of their deadlines (less this
/// process' recent lag in reading replies) and the command timeout from now, or not at all;
/// its verdict is waited for until the connection would count as dead ([`SILENCE`]), and
/// for a command timeout past the call's bound at least, however soon its requests stop
/// waiting. A call Redis ran too late is sent again with the requests that still have time;
/// the others are answered (nothing was counted) and leave `requests`. The results are those
/// of the requests that stay, in order.
async fn exchange_in_time<L: Link>(
    state: &LaneState<L>,
    requests: &mut Vec<Request>,
) -> Result<(Vec<Vec<Result<Decision, BackendError>>>, Ran), Failure> {
    let timeout = state.shared.command_timeout;
    loop {
        // The requests whose caller gave up before this call have their answer: they stay
        // out of it, and the others are sent from now on.
        requests.retain(|request| {
            let sending = request.turn.send();
            if !sending {
                state.capacity.release(request.hits.len());
            }
            sending
        });
        let sent = Instant::now();
        let Some(earliest) = requests.iter().map(|r| r.deadline).min() else {
            let nothing = Ran { sent, at: None };
            return Ok((Vec::new(), nothing));
        };
        let bound = sent + timeout;
        // A verdict reaches its request later than the quickest reply would: the script
        // must run early enough for it to arrive by the request's deadline, or a request
        // answered by its policy would be counted as well.
        let lag = Duration::from_micros(state.reading_lag_micros.load(Ordering::Relaxed));
        let in_time = earliest.checked_sub(lag).unwrap_or(earliest);
        let deadline = state.redis_clock.redis_time_at(in_time.min(bound));
        // The script decides nothing after `bound`, so whatever comes back is a verdict,
        // worth waiting for until the connection would count as dead (and one timeout past
        // the bound at least), even once the requests stopped waiting (at most
        // redis_max_wait_ms): a server short of CPU reads its replies late, and a verdict
        // Redis gave in time is no less valid; a late one still measures the round trip,
        // which tells a Redis too far for the timeout; and on a near Redis the next call
        // leaves only after this one, so a stalled Redis is not sent call after call.
        let verdict_by = (bound + timeout).max(sent + state.silence());
        let groups: Vec<Group<'_>> = (requests.iter())
            .map(|request| Group {
                mode: request.mode,
                hits: &request.hits,
            })
            .collect();
        let reply = match timeout_at(verdict_by, exchange(state, &groups, deadline)).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(error)) => return Err(Failure::Broken(error)),
            Err(_) => return Err(Failure::Unanswered { sent }),
        };
        let received = Instant::now();
        let ran_at = match script::read_reply(&reply, &groups) {
            Ok(Answer::Decided { ran, hits, .. }) => {
                state.redis_clock.observe(ran.finished, received);
                state.note_reading_lag(ran.finished, received);
                let ran = Ran {
                    sent,
                    at: Some(ran),
                };
                return Ok((by_request(requests, hits), ran));
            }
            Ok(Answer::Late { ran_at }) => {
                state.redis_clock.observe(ran_at, received);
                ran_at
            }
            // A reply that is no answer (an error reply, a broken one) fails every hit; the
            // connection answered, so it stays.
            Err(error) => {
                let ran = Ran { sent, at: None };
                return Ok((answer_all(requests, |_| error.clone()), ran));
            }
        };
        ran_late(state, requests, sent, ran_at);
    }
}

/// Redis ran the call sent at `sent` at `ran_at`, past its deadline, and decided nothing: a
/// queue that long is a reason to admit less; the requests whose wait is over are answered
/// [`BackendError::Late`], and the others stay in `requests` to go again.
fn ran_late<L: Link>(
    state: &LaneState<L>,
    requests: &mut Vec<Request>,
    sent: Instant,
    ran_at: u64,
) {
    let now = Instant::now();
    let late = Ran {
        sent,
        at: Some(RanAt {
            started: ran_at,
            finished: ran_at,
        }),
    };
    let times = CallTimes {
        waited: None,
        redis_wait: state.redis_wait(&late),
        redis_wait_before: None,
    };
    state.capacity.answered(times, now);
    let (waiting, expired): (Vec<Request>, Vec<Request>) = std::mem::take(requests)
        .into_iter()
        .partition(|r| r.deadline > now && !r.reply.is_closed());
    for request in expired {
        state.capacity.release(request.hits.len());
        let _ = (request.reply).send(vec![Err(BackendError::Late); request.hits.len()]);
    }
    *requests = waiting;
}

/// One sample of the server's clock: `TIME`. A connection that fails fails the call; an
/// error reply only leaves the clock unknown (the script reads `TIME` itself, so its reply
/// gives the next call one).
async fn read_redis_clock<L: Link>(state: &LaneState<L>) -> Result<(), BackendError> {
    let asked = Instant::now();
    let reply = state.link.query(&redis::cmd("TIME")).await?;
    let received = Instant::now();
    let round_trip = received.saturating_duration_since(asked).as_micros();
    (state.quickest_round_trip).observe(i64::try_from(round_trip).unwrap_or(i64::MAX), received);
    match redis::from_redis_value::<(u64, u64)>(reply) {
        Ok((seconds, micros)) => {
            let now = seconds.saturating_mul(1_000_000).saturating_add(micros);
            state.redis_clock.observe(now, received);
        }
        Err(error) => tracing::debug!(%error, "redis TIME failed; the first call has no deadline"),
    }
    Ok(())
}

/// A timeout for each of `request`'s hits.
fn timed_out<L>(state: &LaneState<L>, request: &Request) -> Vec<Result<Decision, BackendError>> {
    let timeout = state.shared.command_timeout;
    vec![Err(BackendError::Timeout(timeout)); request.hits.len()]
}

/// `hits`' results, a run for each request in order.
fn by_request(
    requests: &[Request],
    hits: Vec<Result<Decision, BackendError>>,
) -> Vec<Vec<Result<Decision, BackendError>>> {
    let mut hits = hits.into_iter();
    (requests.iter())
        .map(|request| hits.by_ref().take(request.hits.len()).collect())
        .collect()
}

/// Sends one script call for `groups` on the lane's connection (once more after loading the
/// script if the server had lost it), to be run by `deadline` (Redis' clock, µs) or not at
/// all; its reply, which a connection that answered always has (an error reply included).
async fn exchange<L: Link>(
    state: &LaneState<L>,
    groups: &[Group<'_>],
    deadline: Option<u64>,
) -> Result<redis::Value, BackendError> {
    let shared = &state.shared;
    let local_now = shared.clock.now_micros();
    let command = script::batch_call(
        &shared.scripts,
        groups,
        state.link.target(),
        ScriptClock::Redis,
        deadline,
        local_now,
    );
    let asked = Instant::now();
    let mut reply = state.link.query(&command).await?;
    let round_trip = asked.elapsed();
    if is_noscript(&reply) {
        tracing::info!("redis lost its script; loading it again");
        state.link.load_scripts(&shared.scripts).await?;
        reply = state.link.query(&command).await?;
    }
    let received = Instant::now();
    let round_trip = i64::try_from(round_trip.as_micros()).unwrap_or(i64::MAX);
    state.quickest_round_trip.observe(round_trip, received);
    *lock(&state.silent_since) = None;
    *lock(&state.last_reply) = Some(received);
    Ok(reply)
}

#[cfg(test)]
mod tests;
