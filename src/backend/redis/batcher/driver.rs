//! The lane's driver: takes what is queued, a call at a time (several beside each other
//! only on a Redis far away), sends each call once the connection is ready, and gives each
//! request its results and its room back.

use std::sync::Arc;

use futures_util::StreamExt;
use futures_util::future::{BoxFuture, FutureExt};
use futures_util::stream::FuturesUnordered;
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout_at};

use super::exchange::{Failure, exchange_in_time};
use super::queue::{Request, answer_all};
use super::{CallTimes, LaneState, Link, MAX_CALLS_IN_FLIGHT, PATIENT, REQUESTS_PER_CALL, lock};
use crate::backend::BackendError;
use crate::limiter::Decision;

/// Takes what is queued, a call at a time: what arrives while a call is out waits for it
/// and goes in the next, unless it cannot afford to. On a Redis far away (see
/// [`LaneState::far`]) the queue is watched while calls are out, and a request whose
/// deadline is nearer than two of the lane's quickest round trips goes at once, in a call
/// beside the ones out (up to [`MAX_CALLS_IN_FLIGHT`]): waiting for the call ahead and then
/// for one's own would take longer than it has. On a near Redis the driver sleeps while its
/// call is out, and wakes once for everything that arrived meanwhile.
pub(super) async fn drive<L: Link>(
    state: Arc<LaneState<L>>,
    mut queue: mpsc::UnboundedReceiver<Request>,
) {
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
    if requests.is_empty() {
        return;
    }
    // On a Redis far away, patient requests (a lease's take) go in a call of their own: in
    // one with requests that must be answered within the command timeout, Redis would run
    // it too late for those, and the patient ones would go again a round trip later. (On
    // a near Redis one call is out at a time, and a patient one beside it would hold the
    // next call back for its round trip.)
    if state.far() {
        let now = Instant::now();
        let (patient, hasty): (Vec<Request>, Vec<Request>) =
            (requests.into_iter()).partition(|request| request.deadline >= now + PATIENT);
        for part in [patient, hasty] {
            if !part.is_empty() {
                calls.push(call(state.clone(), part).boxed());
            }
        }
    } else {
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

/// A timeout for each of `request`'s hits.
fn timed_out<L>(state: &LaneState<L>, request: &Request) -> Vec<Result<Decision, BackendError>> {
    let timeout = state.shared.command_timeout;
    vec![Err(BackendError::Timeout(timeout)); request.hits.len()]
}
