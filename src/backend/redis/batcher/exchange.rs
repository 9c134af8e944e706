//! One call's exchange with Redis: sent with a deadline on Redis' clock, its reply read
//! into each request's results (again, with the requests that still have time, when Redis
//! ran it too late), and what it says of the wait and of this process' reading lag.

use std::sync::atomic::Ordering;
use std::time::Duration;

use deadpool_redis::redis;
use tokio::time::{Instant, timeout_at};

use super::queue::{Request, answer_all};
use super::script::{self, Answer, Group, RanAt, ScriptClock};
use super::{CallTimes, LaneState, Link, PATIENT, is_noscript, lock};
use crate::backend::BackendError;
use crate::limiter::Decision;

/// When a call that Redis answered went out (locally), and when it finished on Redis' clock
/// (`None` when the reply did not say).
pub(super) struct Ran {
    pub(super) sent: Instant,
    pub(super) at: Option<RanAt>,
}

/// Why a call has no verdict.
pub(super) enum Failure {
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
pub(super) async fn exchange_in_time<L: Link>(
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
        // Patient requests alone (a lease's take) may be run until their deadline: on a
        // Redis farther than the command timeout, that is what lets them be run at all.
        let bound = if earliest >= sent + PATIENT {
            earliest
        } else {
            sent + timeout
        };
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
pub(super) async fn read_redis_clock<L: Link>(state: &LaneState<L>) -> Result<(), BackendError> {
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

impl<L: Link> LaneState<L> {
    /// How long a call waited before Redis ran it, from its send to the script's start, on
    /// Redis' clock.
    pub(super) fn redis_wait(&self, ran: &Ran) -> Option<Duration> {
        let sent_at = self.redis_clock.redis_time_at(ran.sent)?;
        Some(Duration::from_micros(
            ran.at?.started.saturating_sub(sent_at),
        ))
    }

    /// Takes the lag of a reply the script finished at `finished_at` (Redis' clock) and this
    /// process read at `received`.
    pub(super) fn note_reading_lag(&self, finished_at: u64, received: Instant) {
        if let Some(lag) = self.redis_clock.lag(finished_at, received) {
            let lag = u64::try_from(lag.as_micros()).unwrap_or(u64::MAX);
            let mean = self.reading_lag_micros.load(Ordering::Relaxed);
            (self.reading_lag_micros).store(mean - mean / 8 + lag / 8, Ordering::Relaxed);
        }
    }
}
