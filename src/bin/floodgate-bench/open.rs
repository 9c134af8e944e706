//! The open loop: requests leave on a fixed schedule, `--rate` per second, whether or not
//! earlier ones were answered, the way independent clients arrive. Each request's latency
//! counts from when it was due, so a stall in the server (or in the generator) is charged to
//! every request it delayed instead of hiding them (no coordinated omission).
//!
//! The schedule is kept by one pacer on an OS thread of its own rather than by tokio tasks:
//! tokio's timer wakes at whole milliseconds, which would make every request up to 1 ms late
//! by the generator's own doing, while a thread's sleep is good to tens of microseconds. The
//! pacer only spawns; the requests run on the runtime.

use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::runtime::Handle;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::Window;
use super::connection::Client;
use super::exchange::{RequestShape, exchange};
use super::outcome::{Counts, Tally};

/// When each request of an open-loop run is due: request `i` at `start + i / rate`, for
/// every such time before `end`. Requests go to the connections in turn, so each connection
/// carries `rate / connections` at evenly interleaved offsets.
#[derive(Debug, Clone)]
pub struct Schedule {
    start: Instant,
    rate: f64,
    end: Instant,
    /// The first request not yet taken.
    next: u64,
}

impl Schedule {
    /// `rate` requests per second, positive and finite (the caller checks).
    pub fn new(start: Instant, rate: f64, end: Instant) -> Schedule {
        Schedule {
            start,
            rate,
            end,
            next: 0,
        }
    }

    pub fn due(&self, request: u64) -> Instant {
        self.start + Duration::from_secs_f64(request as f64 / self.rate)
    }

    /// When the next request not yet taken is due; `None` once the schedule has ended.
    pub fn next_due(&self) -> Option<Instant> {
        Some(self.due(self.next)).filter(|&due| due < self.end)
    }

    /// Every request due by `now` and not yet taken, however many a stall let pile up: a late
    /// pacer catches up instead of lowering the rate.
    pub fn take_due(&mut self, now: Instant) -> Range<u64> {
        let first = self.next;
        while self.next_due().is_some_and(|due| due <= now) {
            self.next += 1;
        }
        first..self.next
    }
}

/// The connection (an index into the clients) that carries request `request`.
pub fn connection_for(request: u64, connections: usize) -> usize {
    (request % connections as u64) as usize
}

/// Starts the open loop at `rate` requests per second over `clients`' connections, with at
/// most `max_in_flight` requests outstanding. The returned task resolves to the tally once
/// the schedule has ended and every request sent has its answer (or gave up).
pub fn start(
    clients: Vec<Client>,
    rate: f64,
    max_in_flight: u32,
    shape: Arc<RequestShape>,
    timeout: Duration,
    window: Window,
) -> JoinHandle<anyhow::Result<Tally>> {
    let tallies: Arc<[Mutex<Tally>]> = clients.iter().map(|_| Mutex::default()).collect();
    let permits = Arc::new(Semaphore::new(max_in_flight as usize));
    let pacer = Pacer {
        schedule: Schedule::new(window.start, rate, window.until),
        window,
        clients,
        shape,
        timeout,
        max_in_flight,
        permits: permits.clone(),
        tallies: tallies.clone(),
        runtime: Handle::current(),
        counts: Counts::default(),
    };
    tokio::spawn(async move {
        let counts = tokio::task::spawn_blocking(move || pacer.run())
            .await
            .context("open-loop pacer")?;
        let mut total = Tally {
            counts,
            ..Tally::default()
        };
        // Each request holds a permit until it is answered or gives up: once all are back,
        // every request is counted.
        let _all_answered = permits
            .acquire_many(max_in_flight)
            .await
            .context("waiting for the last answers")?;
        for tally in tallies.iter() {
            total.merge(std::mem::take(&mut *lock(tally)));
        }
        Ok(total)
    })
}

/// The shortest sleep of the pacer. Each wake-up costs the generator CPU (a context switch,
/// and waking a runtime worker for the requests it spawns), which it shares with the server
/// it measures: at high rates the pacer wakes every 0.1 ms and sends what fell due
/// meanwhile, so no request leaves more than about 0.1 ms (plus the OS' timer slack) late.
const PACER_TICK: Duration = Duration::from_micros(100);

/// Issues each request of the schedule when it is due, from a thread of its own.
struct Pacer {
    schedule: Schedule,
    window: Window,
    clients: Vec<Client>,
    shape: Arc<RequestShape>,
    timeout: Duration,
    max_in_flight: u32,
    /// One per request allowed out; a request holds one until it has its answer.
    permits: Arc<Semaphore>,
    /// The measured requests' samples, one tally per connection to keep lock contention low.
    tallies: Arc<[Mutex<Tally>]>,
    runtime: Handle,
    /// What the pacer itself counts: requests sent and dropped, the peak in flight.
    counts: Counts,
}

impl Pacer {
    fn run(mut self) -> Counts {
        while let Some(due) = self.schedule.next_due() {
            let now = Instant::now();
            if due > now {
                std::thread::sleep((due - now).max(PACER_TICK));
                continue;
            }
            for request in self.schedule.take_due(now) {
                self.issue(request);
            }
        }
        self.counts
    }

    /// Spawns request `request`, or counts it dropped when `max_in_flight` are outstanding.
    fn issue(&mut self, request: u64) {
        let due = self.schedule.due(request);
        let measured = self.window.measures(due);
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            self.counts.dropped += u64::from(measured);
            return;
        };
        self.counts.sent += 1;
        if measured {
            let in_flight = self.max_in_flight as usize - self.permits.available_permits();
            self.counts.peak_in_flight = self.counts.peak_in_flight.max(in_flight as u64);
        }
        let connection = connection_for(request, self.clients.len());
        let mut client = self.clients[connection].clone();
        let shape = self.shape.clone();
        let tallies = self.tallies.clone();
        let timeout = self.timeout;
        self.runtime.spawn(async move {
            let sample = exchange(&mut client, shape.request(), timeout, due).await;
            if measured {
                lock(&tallies[connection]).record(&sample);
            }
            drop(permit);
        });
    }
}

/// A tally stays consistent even if a task panicked holding it: each record is one call.
fn lock(tally: &Mutex<Tally>) -> MutexGuard<'_, Tally> {
    tally.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: f64) -> Duration {
        Duration::from_secs_f64(n / 1000.0)
    }

    #[test]
    fn request_i_is_due_at_i_over_rate() {
        let start = Instant::now();
        let schedule = Schedule::new(start, 1000.0, start + ms(1000.0));
        assert_eq!(schedule.due(0), start);
        assert_eq!(schedule.due(3), start + ms(3.0));
        assert_eq!(schedule.due(2500), start + ms(2500.0));
    }

    #[test]
    fn fractional_rates_space_requests_evenly() {
        let start = Instant::now();
        let schedule = Schedule::new(start, 0.5, start + ms(10_000.0));
        assert_eq!(schedule.due(1), start + ms(2000.0));
    }

    #[test]
    fn takes_every_request_due_by_now_once() {
        let start = Instant::now();
        let mut schedule = Schedule::new(start, 1000.0, start + ms(1000.0));
        assert_eq!(schedule.take_due(start + ms(10.5)), 0..11);
        assert_eq!(schedule.take_due(start + ms(10.5)), 11..11);
        assert_eq!(schedule.next_due(), Some(start + ms(11.0)));
    }

    #[test]
    fn a_late_pacer_catches_up_on_everything_missed() {
        let start = Instant::now();
        let mut schedule = Schedule::new(start, 1000.0, start + ms(1000.0));
        schedule.take_due(start);
        assert_eq!(schedule.take_due(start + ms(100.0)), 1..101);
    }

    #[test]
    fn nothing_is_due_before_start() {
        let start = Instant::now() + ms(50.0);
        let mut schedule = Schedule::new(start, 1000.0, start + ms(1000.0));
        assert_eq!(schedule.take_due(start - ms(1.0)), 0..0);
        assert_eq!(schedule.next_due(), Some(start));
    }

    #[test]
    fn the_schedule_ends_before_its_end() {
        let start = Instant::now();
        let mut schedule = Schedule::new(start, 1000.0, start + ms(5.0));
        assert_eq!(schedule.take_due(start + ms(60_000.0)), 0..5);
        assert_eq!(schedule.next_due(), None);
    }

    #[test]
    fn connections_take_turns_so_each_carries_an_even_share() {
        let on_connection_1: Vec<u64> = (0..12).filter(|&i| connection_for(i, 4) == 1).collect();
        assert_eq!(on_connection_1, [1, 5, 9]);
    }
}
