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
//! Patient requests (a wait of [`PATIENT`] or more: a lease's take of a block) are the
//! exception: sent when their wait holds two round trips, in calls of their own on a far
//! Redis, which Redis may start until their deadline.
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
//! (`ServerLink` in `standalone.rs`) or to one node of a cluster (`cluster/node.rs`).
//!
//! The rooms: this file is the lane (its state, admission, the connection's preparation and
//! its silence); `queue.rs` what waits on it (a request and its turn); `driver.rs` takes
//! what is queued and sends it as calls; `exchange.rs` is one call's exchange with Redis and
//! what it says of the wait; `distance.rs` how far Redis is (near, far, too far).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use deadpool_redis::redis;
use futures_util::future::{BoxFuture, FutureExt, Shared as SharedFuture};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, timeout, timeout_at};

mod distance;
mod driver;
mod exchange;
mod queue;

use driver::drive;
use exchange::read_redis_clock;
use queue::{Request, Turn};

use super::capacity::{CallTimes, Capacity, ShedReason};
use super::deadline::{EPOCH, RedisClock};
use super::recent::RecentLeast;
use super::script::{self, Mode, RedisHit, Scripts, Target};
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

/// A request with this long to wait or longer is patient (a lease's take of a block,
/// docs/algorithms.md, "Leases"; no request's own wait is this long unless
/// `redis_max_wait_ms` says so): it is sent to a Redis too far for the command timeout when
/// its wait holds two round trips, and a call of patient requests alone may start in Redis
/// until their deadline, not only within the command timeout.
pub(crate) const PATIENT: Duration = Duration::from_millis(1500);

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
            let patient = match too_far {
                BackendError::TooFar { round_trip, .. } => {
                    deadline >= now + PATIENT && deadline >= now + 2 * round_trip
                }
                _ => false,
            };
            if !patient {
                return vec![Err(too_far); count];
            }
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
    ///
    /// The whole takes at most the connect timeout and two command timeouts, or two of the
    /// round trips the clock's read measured when they are longer: on a Redis farther than
    /// the command timeout every step is a round trip (one 100 ms away took 300 ms for
    /// three steps, and a bound of 280 ms failed every first set-up).
    async fn prepare(self: Arc<Self>) -> Result<u64, BackendError> {
        let start = Instant::now();
        let (connect, command) = (self.shared.connect_timeout, self.shared.command_timeout);
        let bound = connect + 2 * command;
        let result = match timeout(bound, self.read_clock_once()).await {
            Ok(Ok(())) => {
                let way = self.quickest_round_trip.least().unwrap_or(0).unsigned_abs();
                let bound = connect + 2 * command.max(Duration::from_micros(way));
                let load = self.link.load_scripts(&self.shared.scripts);
                match timeout_at(start + bound, load).await {
                    Ok(result) => result,
                    Err(_) => Err(BackendError::NotReady(bound)),
                }
            }
            Ok(Err(error)) => Err(error),
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

    /// Reads the server's clock (opening the connection) unless a lane to it has already.
    async fn read_clock_once(&self) -> Result<(), BackendError> {
        if self.redis_clock.knows_offset() {
            return Ok(());
        }
        read_redis_clock(self).await
    }

    /// How long a connection may answer nothing while a call waits before it counts as dead:
    /// [`SILENCE`] (or four command timeouts) past the quickest round trip lately, since no
    /// reply comes sooner than that. On a Redis 50 ms away a call's reply takes 100 ms; a
    /// bound that left out the way (100 ms flat) dropped the connection under its calls, and
    /// each new one cost the lane a connection and a script load before its next call.
    fn silence(&self) -> Duration {
        let quickest = self.quickest_round_trip.least().unwrap_or(0).unsigned_abs();
        SILENCE.max(4 * self.shared.command_timeout) + Duration::from_micros(quickest)
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

#[cfg(test)]
mod tests;
