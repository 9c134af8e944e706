//! How far Redis is: the quickest round trip lately decides whether calls go beside each
//! other (far) or one at a time (near), and whether Redis is too far to call at all, in
//! which case a `TIME` measures the way again now and then until it is near enough.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::{Instant, timeout};

use super::exchange::read_redis_clock;
use super::queue::Request;
use super::{FAR_PROBE_INTERVAL, FAR_SAMPLES, LaneState, Link, PATIENT, lock, redis_io};
use crate::backend::BackendError;

impl<L: Link> LaneState<L> {
    /// Whether a round trip is at least a quarter of the command timeout: a request that
    /// waits for the call ahead and then for its own spends half its time or more on the
    /// way, and calls go beside each other. On a near Redis (a round trip of well under a
    /// millisecond) the driver does not watch the queue while its call is out: that would
    /// wake it once per request, for nothing (one run measured 22.6 → 23.8 µs of server
    /// CPU per decision with it, within this machine's run-to-run noise).
    pub(super) fn far(&self) -> bool {
        let quickest = self.quickest_round_trip.least().unwrap_or(0).unsigned_abs();
        self.far_at(Duration::from_micros(quickest))
    }

    /// Whether a lane whose quickest round trip is `round_trip` is far.
    fn far_at(&self, round_trip: Duration) -> bool {
        4 * round_trip >= self.shared.command_timeout
    }

    /// Why a request cannot be sent now: the quickest round trip lately (of at least
    /// [`FAR_SAMPLES`]) is above the command timeout, so no call could be answered within
    /// it. While the quickest is above it, a `TIME` measures the way again: at once while
    /// the samples are too few to tell, then every [`FAR_PROBE_INTERVAL`]. A lane that was
    /// near learns it is far once its quicker samples age out (10–20 s); a change either way
    /// is logged.
    pub(super) fn too_far(self: &Arc<Self>, now: Instant) -> Option<BackendError> {
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
    /// before the earliest deadline, one for the call and one for the link's variance; at
    /// once for a patient request on a Redis far away, which goes in a call of its own and
    /// holds no other back (a lease's take that waited for the calls out came a round trip
    /// later, and its block ran dry meanwhile). `None` before the first reply, or with
    /// nothing waiting.
    pub(super) fn send_by(&self, waiting: &[Request]) -> Option<Instant> {
        let round_trip = Duration::from_micros(self.quickest_round_trip.least()?.unsigned_abs());
        let earliest = waiting.iter().map(|r| r.deadline).min()?;
        if self.far_at(round_trip) {
            let now = Instant::now();
            if waiting.iter().any(|r| r.deadline >= now + PATIENT) {
                return Some(now);
            }
        }
        Some(earliest.checked_sub(2 * round_trip).unwrap_or(earliest))
    }
}
