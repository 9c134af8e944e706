//! Quota leases: a replica takes blocks of a counter's quota out of the shared store and
//! decides that counter's hits from them in process, so a hot counter costs the store one
//! call per block instead of one per request (a limit with `lease: true`;
//! docs/algorithms.md, "Leases").
//!
//! A block is an ordinary hit of many on the shared counter: the store counts it like any
//! other, so the blocks of every replica and the hits decided without one never add up past
//! the limit. What a block holds is spent here, one request at a time, while it lasts and
//! while its window runs (a fixed window's block ends with the window the store counted it
//! in; a token bucket's after [`TOKENS_KEPT`], when what is left goes back). The next block
//! is taken in the background once half of the current one is spent, so while a block lasts
//! no request waits for the store.
//!
//! Blocks follow demand: what this replica spent (and asked for) a second since its last
//! block, for [`AHEAD`] of it (six takes' time on a Redis far away; twice the last block
//! when it ran out before the next came); never more than a quarter of what the shared count had left at
//! the last take, so near the end each block is one hit and the last hits are exact. A block
//! nobody spends from for [`IDLE`] goes back to the shared count (a fixed window's only while
//! its window still runs: the call carries the window's end as its deadline, and the store
//! counts nothing past it). A replica that dies loses what it held until the window resets.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use foldhash::fast::RandomState;
use tokio::sync::Notify;
use tokio::time::{Instant, timeout_at};

use super::{BackendError, CounterHit};
use crate::limiter::{Algorithm, CounterKey, Decision, Limit};

/// How far ahead a block reaches at the replica's demand: about five takes a second while
/// demand holds, each asked when half the block before it is left.
pub const AHEAD: Duration = Duration::from_millis(200);

/// On a Redis far away, a block reaches this many takes' time ahead, so that the next block
/// (taken at half spent) comes before this one runs out.
const LATENCIES_AHEAD: u32 = 6;

/// A block nobody spent from for this long goes back to the shared count.
pub const IDLE: Duration = Duration::from_secs(1);

/// How long a token bucket's block is kept: tokens taken ahead let the bucket's promise
/// (capacity + rate × τ in any interval τ) stretch by the rate times this, at most.
pub const TOKENS_KEPT: Duration = Duration::from_secs(1);

/// After a take failed (the store stalled, timed out, is far) or found nothing left, the
/// next waits this long: an exhausted leased counter is refused here and polled this often.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// How long a take may wait for the store: it is off the request path.
pub const TAKE_WAIT: Duration = Duration::from_secs(2);

/// A fixed window's give-back must reach the store this long before the window ends: a
/// give-back counted in the next window would hand out quota that window never had.
const GIVE_BACK_MARGIN: Duration = Duration::from_millis(50);

/// A block no bigger than this share of what the shared count had left at the last take.
const SHARE_OF_LEFT: u64 = 4;

/// The most counters a backend leases at once (a lease is some 200 bytes and its key); a
/// counter beyond them is decided by the store, hit by hit.
pub const MOST_LEASED: usize = 10_000;

const SHARDS: usize = 16;

/// The leases of one store's counters.
pub struct Leases {
    shards: Box<[Mutex<HashMap<CounterKey, Lease, RandomState>>]>,
    hasher: RandomState,
    per_shard: usize,
    /// Whether a hit was decided here yet (the sweeping task starts then).
    used: AtomicBool,
    /// Blocks taken, and hits decided from the blocks of leases forgotten since.
    takes: AtomicU64,
    decided_before: AtomicU64,
    /// Told whenever a take ends (a block came, or none will): hits that wait for a block
    /// on its way ([`Leases::wait_for_block`]) look again.
    take_ended: Notify,
}

/// What the leases hold and did, for /metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaseCounts {
    /// Counters leased now, and the quota their blocks hold unspent.
    pub counters: u64,
    pub held: u64,
    /// Hits decided here (allowed from a block, or refused while the shared count had
    /// nothing left), and blocks taken, since start.
    pub decided: u64,
    pub takes: u64,
}

/// One counter's lease.
#[derive(Debug)]
struct Lease {
    /// The limit its blocks were taken under: a changed rule starts over.
    limit: Limit,
    /// Quota taken from the shared count and not spent yet.
    held: u64,
    /// When what is held stops counting: its window's end (a fixed window), or
    /// [`TOKENS_KEPT`] after the first of it was taken (a token bucket).
    ends: Instant,
    /// What the shared count had left after the last take, and when its quota comes back.
    left: u64,
    resets: Instant,
    /// Hits spent or asked for since `since`: the replica's demand.
    asked: u64,
    since: Instant,
    /// The demand at the last take, hits a second.
    rate: f64,
    /// How long the last take took, sent to answered: a block reaches further ahead on a
    /// Redis far away.
    latency: Duration,
    /// The last block asked, and whether hits found the lease spent while it was out: the
    /// demand was underestimated, and the next block is twice as large at least.
    last_block: u64,
    ran_dry: bool,
    /// When a hit last came.
    last_hit: Instant,
    /// Hits decided from its blocks (or refused here).
    decided: u64,
    /// A take is out.
    taking: bool,
    /// No take before this (one failed).
    retry_at: Instant,
}

/// A block to take: of which counter, under which limit, and how much to ask first.
#[derive(Debug)]
pub struct Take {
    pub key: CounterKey,
    pub limit: Limit,
    pub asked: u64,
}

/// Quota to give back, before `deadline` when it has one (a fixed window's end).
#[derive(Debug)]
pub struct GiveBack {
    pub key: CounterKey,
    pub limit: Limit,
    pub amount: u64,
    pub deadline: Option<Instant>,
}

/// Whether `hit` may be decided from a lease: a hit that takes quota under a leased limit.
pub fn leasable(hit: &CounterHit<'_>) -> bool {
    hit.limit.lease && !hit.limit.overshoot && !hit.hits.negative && hit.hits.amount > 0
}

impl Default for Leases {
    fn default() -> Self {
        Leases::new(MOST_LEASED)
    }
}

impl Leases {
    /// Leases of at most `capacity` counters.
    pub fn new(capacity: usize) -> Self {
        Leases {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::default(),
            per_shard: capacity.div_ceil(SHARDS),
            used: AtomicBool::new(false),
            takes: AtomicU64::new(0),
            decided_before: AtomicU64::new(0),
            take_ended: Notify::new(),
        }
    }

    /// True the first time it is asked: the first leased hit starts the sweeping task.
    pub fn first_use(&self) -> bool {
        !self.used.load(Ordering::Relaxed) && !self.used.swap(true, Ordering::Relaxed)
    }

    fn shard(&self, key: &CounterKey) -> MutexGuard<'_, HashMap<CounterKey, Lease, RandomState>> {
        use std::hash::BuildHasher;
        let index = (self.hasher.hash_one(key) as usize) % SHARDS;
        self.shards[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Decides `amount` hits on `key` under `limit` from what this replica holds, when it
    /// holds enough, or refuses them when the shared count had too little left at the last
    /// take (until its quota comes back): the answer, and the block the caller should take
    /// now (then it must call [`Leases::took`] or [`Leases::failed`] when done). `None`:
    /// the store decides this hit.
    pub fn decide(
        &self,
        key: &CounterKey,
        limit: &Limit,
        amount: u64,
        now: Instant,
    ) -> (Option<Decision>, Option<Take>) {
        let mut shard = self.shard(key);
        let lease = match shard.get_mut(key) {
            Some(lease) if lease.limit == *limit => lease,
            found => {
                if found.is_none() && shard.len() >= self.per_shard {
                    return (None, None);
                }
                shard.insert(key.clone(), Lease::new(limit.clone(), now));
                shard.get_mut(key).expect("just inserted")
            }
        };
        lease.asked = lease.asked.saturating_add(amount);
        lease.last_hit = now;
        let decided = lease.spend(amount, now);
        if decided.is_none() {
            lease.ran_dry |= lease.taking;
        }
        let take = lease.take_due(now).then(|| {
            lease.taking = true;
            let asked = lease.block();
            lease.last_block = asked;
            lease.ran_dry = false;
            Take {
                key: key.clone(),
                limit: limit.clone(),
                asked,
            }
        });
        (decided, take)
    }

    /// Puts back `amount` decided from the lease of `key` for a request another hit
    /// rejected (it takes nothing).
    pub fn put_back(&self, key: &CounterKey, amount: u64) {
        if let Some(lease) = self.shard(key).get_mut(key) {
            lease.held = lease.held.saturating_add(amount);
        }
    }

    /// A take of `asked` for `key`, sent at `sent`, was answered `decision`. Returns what to
    /// ask next (the take was refused, and the shared count has some left) or nothing.
    pub fn took(&self, key: &CounterKey, asked: u64, decision: Decision, sent: Instant) -> u64 {
        let mut shard = self.shard(key);
        let Some(lease) = shard.get_mut(key) else {
            return 0;
        };
        let now = Instant::now();
        lease.latency = now.saturating_duration_since(sent);
        lease.left = decision.remaining;
        lease.resets = sent + Duration::from_micros(decision.reset_micros);
        if !decision.allowed {
            let again = decision.remaining.min(asked / 2);
            if again == 0 {
                lease.taking = false;
                lease.retry_at = now + RETRY_PAUSE;
                self.take_ended.notify_waiters();
            }
            return again;
        }
        // The block counts from the instant the take went out: the store counted it later,
        // so its window (as the store saw it) ends no earlier than this.
        let ends = match lease.limit.algorithm {
            Algorithm::FixedWindow => sent + Duration::from_micros(decision.reset_micros),
            _ if lease.held > 0 && now < lease.ends => lease.ends,
            _ => sent + TOKENS_KEPT,
        };
        let same_window = now < lease.ends
            && ends.max(lease.ends) - ends.min(lease.ends)
                < Duration::from_micros(lease.limit.window_micros() / 2);
        if same_window {
            lease.held = lease.held.saturating_add(asked);
            lease.ends = ends.max(lease.ends);
        } else {
            lease.held = asked;
            lease.ends = ends;
        }
        // A fixed window's quota comes back when the block ends: the answers' time left
        // runs out with the block, not before it.
        if lease.limit.algorithm == Algorithm::FixedWindow {
            lease.resets = lease.ends;
        }
        lease.taking = false;
        lease.measure(now);
        self.takes.fetch_add(1, Ordering::Relaxed);
        self.take_ended.notify_waiters();
        0
    }

    /// A take of `key` failed: the next waits a little.
    pub fn failed(&self, key: &CounterKey, error: &BackendError) {
        tracing::debug!(%error, "a lease's block could not be taken");
        if let Some(lease) = self.shard(key).get_mut(key) {
            lease.taking = false;
            lease.retry_at = Instant::now() + RETRY_PAUSE;
        }
        self.take_ended.notify_waiters();
    }

    /// Decides `amount` hits on `key` under `limit` from the block a take is bringing, when
    /// the lease ran dry and the store cannot decide them in time (it is too far): waits
    /// for the take to end, until `deadline`. `None` when no take is out, none brought
    /// enough, or the deadline came first. The hits' demand was counted when they were
    /// first decided ([`Leases::decide`]).
    pub async fn wait_for_block(
        &self,
        key: &CounterKey,
        limit: &Limit,
        amount: u64,
        deadline: Instant,
    ) -> Option<Decision> {
        loop {
            // Enabled before the lease is looked at, so a take that ends in between wakes it.
            let ended = self.take_ended.notified();
            let mut ended = std::pin::pin!(ended);
            ended.as_mut().enable();
            {
                let mut shard = self.shard(key);
                let lease = shard.get_mut(key).filter(|lease| lease.limit == *limit)?;
                if let Some(decision) = lease.spend(amount, Instant::now()) {
                    return Some(decision);
                }
                if !lease.taking {
                    return None;
                }
            }
            timeout_at(deadline, ended).await.ok()?;
        }
    }

    /// What goes back to the shared count at `now`: blocks nobody spent from for [`IDLE`],
    /// and token buckets' blocks kept [`TOKENS_KEPT`]. A fixed window's block whose window
    /// ended is void (the window took it), and a lease long idle is forgotten.
    pub fn sweep(&self, now: Instant) -> Vec<GiveBack> {
        let mut back = Vec::new();
        for shard in &self.shards {
            let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            shard.retain(|key, lease| {
                let idle = now.saturating_duration_since(lease.last_hit) >= IDLE;
                let ended = now >= lease.ends;
                if lease.held > 0 && (idle || ended) {
                    let deadline = match lease.limit.algorithm {
                        Algorithm::FixedWindow => lease.ends.checked_sub(GIVE_BACK_MARGIN),
                        _ => Some(now + TAKE_WAIT),
                    };
                    if deadline.is_some_and(|deadline| deadline > now) {
                        back.push(GiveBack {
                            key: key.clone(),
                            limit: lease.limit.clone(),
                            amount: lease.held,
                            deadline,
                        });
                    }
                    lease.held = 0;
                }
                let kept =
                    lease.taking || now.saturating_duration_since(lease.last_hit) < 10 * IDLE;
                if !kept {
                    self.decided_before
                        .fetch_add(lease.decided, Ordering::Relaxed);
                }
                kept
            });
        }
        back
    }

    /// What the leases hold now and did since start.
    pub fn counts(&self) -> LeaseCounts {
        let mut counts = LeaseCounts {
            decided: self.decided_before.load(Ordering::Relaxed),
            takes: self.takes.load(Ordering::Relaxed),
            ..LeaseCounts::default()
        };
        let now = Instant::now();
        for shard in &self.shards {
            let shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            for lease in shard.values() {
                counts.counters += 1;
                if now < lease.ends {
                    counts.held = counts.held.saturating_add(lease.held);
                }
                counts.decided = counts.decided.saturating_add(lease.decided);
            }
        }
        counts
    }
}

impl Lease {
    /// Decides `amount` hits from what is held, or refuses them when the shared count had
    /// too little left at the last take; `None`: neither (the store decides them).
    fn spend(&mut self, amount: u64, now: Instant) -> Option<Decision> {
        if now >= self.ends {
            self.held = 0;
        }
        let reset_micros = micros(self.resets.saturating_duration_since(now));
        let decided = if self.held >= amount {
            self.held -= amount;
            Some(Decision {
                allowed: true,
                remaining: self.left.saturating_add(self.held),
                reset_micros,
            })
        } else if now < self.resets && self.left.saturating_add(self.held) < amount {
            // The shared count had too little left at the last take, and the block too: the
            // store would refuse it. A take polls the store meanwhile.
            Some(Decision {
                allowed: false,
                remaining: self.left.saturating_add(self.held),
                reset_micros,
            })
        } else {
            None
        };
        self.decided += u64::from(decided.is_some());
        decided
    }

    fn new(limit: Limit, now: Instant) -> Self {
        Lease {
            limit,
            held: 0,
            ends: now,
            left: u64::MAX,
            resets: now,
            asked: 0,
            since: now,
            rate: 0.0,
            latency: Duration::ZERO,
            last_block: 0,
            ran_dry: false,
            last_hit: now,
            decided: 0,
            taking: false,
            retry_at: now,
        }
    }

    /// Whether the next block should be taken now: none is out, and half of the last is
    /// spent (or nothing is held that counts).
    fn take_due(&self, now: Instant) -> bool {
        if self.taking || now < self.retry_at {
            return false;
        }
        let held = if now < self.ends { self.held } else { 0 };
        held == 0 || 2 * held <= self.block()
    }

    /// The next block: the demand for [`AHEAD`] (or [`LATENCIES_AHEAD`] takes' time, if
    /// longer), at least one hit, at most a quarter of
    /// what the shared count had left (one hit at a time near the end) and the limit.
    fn block(&self) -> u64 {
        // What was asked since the last measure, over at least a quarter of `AHEAD`: a few
        // hits in the first microseconds are no rate.
        let elapsed = (self.since.elapsed()).max(AHEAD / 4).as_secs_f64();
        let rate = self.rate.max(self.asked as f64 / elapsed);
        let ahead = AHEAD.max(LATENCIES_AHEAD * self.latency);
        let mut wanted = (rate * ahead.as_secs_f64()).ceil() as u64;
        if self.ran_dry {
            wanted = wanted.max(self.last_block.saturating_mul(2));
        }
        let share = (self.left / SHARE_OF_LEFT).max(1);
        let most = match self.limit.algorithm {
            Algorithm::TokenBucket => self.limit.capacity(),
            _ => u64::from(self.limit.requests_per_unit),
        };
        wanted.clamp(1, share.min(most).max(1))
    }

    /// Starts a new measure of demand, keeping the last as the rate.
    fn measure(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.since).as_secs_f64();
        if elapsed >= 0.01 {
            self.rate = self.asked as f64 / elapsed;
            self.asked = 0;
            self.since = now;
        }
    }
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::limiter::Unit;

    fn key() -> CounterKey {
        let limit = limit();
        CounterKey::new("d", "r", 0, &limit, [("tenant", "t")])
    }

    fn limit() -> Limit {
        Limit {
            lease: true,
            ..Limit::per(1_000, Unit::Hour)
        }
    }

    /// What the store answers a take of `asked` with `left` before it, by its rule.
    fn answer(asked: u64, left: u64) -> Decision {
        let allowed = asked <= left;
        let remaining = if allowed { left - asked } else { left };
        Decision {
            allowed,
            remaining,
            reset_micros: 3_600_000_000,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn blocks_shrink_to_one_hit_as_the_shared_count_runs_out() {
        let (leases, key, limit) = (Leases::default(), key(), limit());
        let mut left = 1_000u64;
        let mut admitted = 0;
        let mut blocks = Vec::new();
        // Demand far above what is left: every hit that finds nothing takes the next block.
        for _ in 0..5_000 {
            tokio::time::advance(Duration::from_millis(1)).await;
            let (decided, take) = leases.decide(&key, &limit, 1, Instant::now());
            admitted += u64::from(decided.is_some_and(|d| d.allowed));
            if let Some(take) = take {
                let mut asked = take.asked;
                while asked > 0 {
                    let decision = answer(asked, left);
                    if decision.allowed {
                        left -= asked;
                        blocks.push(asked);
                    }
                    asked = leases.took(&key, asked, decision, Instant::now());
                }
            }
        }
        assert_eq!(admitted + left, 1_000, "blocks {blocks:?}");
        assert_eq!(left, 0);
        // Never more than a quarter of what was left, and the last blocks one hit each.
        assert!(blocks.ends_with(&[1, 1, 1]), "{blocks:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_block_spent_while_the_next_was_out_doubles_the_next() {
        let (leases, key, limit) = (Leases::default(), key(), limit());
        let (_, take) = leases.decide(&key, &limit, 1, Instant::now());
        let first = take.expect("a first take").asked;
        // Hits keep coming while the take is out: the lease has nothing for them.
        for _ in 0..3 {
            let (decided, take) = leases.decide(&key, &limit, 1, Instant::now());
            assert!(decided.is_none() && take.is_none());
        }
        leases.took(&key, first, answer(first, 1_000), Instant::now());
        let next = (0..=first)
            .find_map(|_| leases.decide(&key, &limit, 1, Instant::now()).1)
            .expect("the next take")
            .asked;
        assert!(next >= 2 * first, "{first} then {next}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_fixed_windows_block_ends_with_its_window_and_an_idle_one_goes_back() {
        let (leases, key, limit) = (Leases::default(), key(), limit());
        let (_, take) = leases.decide(&key, &limit, 1, Instant::now());
        let asked = take.expect("a take").asked;
        // The window ends 2 s after the take went out.
        let window_ends = Decision {
            reset_micros: 2_000_000,
            ..answer(asked, 1_000)
        };
        leases.took(&key, asked, window_ends, Instant::now());
        assert_eq!(leases.counts().held, asked);
        // Idle for a second: it goes back, with the window's end (less a margin) as the
        // give-back's deadline.
        tokio::time::advance(IDLE).await;
        let back = leases.sweep(Instant::now());
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].amount, asked);
        assert!(
            back[0]
                .deadline
                .is_some_and(|d| d < Instant::now() + Duration::from_secs(1))
        );
        assert_eq!(leases.counts().held, 0);
        // A block taken again ends with its window: past it, nothing is decided from it.
        let (_, take) = leases.decide(&key, &limit, 1, Instant::now());
        if let Some(take) = take {
            leases.took(&key, take.asked, window_ends, Instant::now());
        }
        tokio::time::advance(Duration::from_secs(3)).await;
        let (decided, _) = leases.decide(&key, &limit, 1, Instant::now());
        assert!(decided.is_none(), "{decided:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_hit_waits_for_the_block_on_its_way_until_its_deadline() {
        let leases = Arc::new(Leases::default());
        let (key, limit) = (key(), limit());
        let (_, take) = leases.decide(&key, &limit, 1, Instant::now());
        let asked = take.expect("a first take").asked;
        // The block is spent (nothing held yet) while the take is out: the hit waits.
        let (decided, _) = leases.decide(&key, &limit, 1, Instant::now());
        assert!(decided.is_none());
        let deadline = Instant::now() + Duration::from_millis(40);
        let waiting = tokio::spawn({
            let (leases, key, limit) = (leases.clone(), key.clone(), limit.clone());
            async move { leases.wait_for_block(&key, &limit, 1, deadline).await }
        });
        tokio::time::advance(Duration::from_millis(10)).await;
        leases.took(&key, asked, answer(asked, 1_000), Instant::now());
        let decided = waiting.await.expect("the waiting task");
        assert!(decided.is_some_and(|d| d.allowed), "{decided:?}");
        assert_eq!(leases.counts().held, asked - 1);

        // Spent again, the next take out, and its answer later than the deadline: no
        // decision, at the deadline.
        let mut next = None;
        while next.is_none() {
            next = leases.decide(&key, &limit, 1, Instant::now()).1;
        }
        while leases.decide(&key, &limit, 1, Instant::now()).0.is_some() {}
        let start = Instant::now();
        let deadline = start + Duration::from_millis(40);
        assert_eq!(leases.wait_for_block(&key, &limit, 1, deadline).await, None);
        assert_eq!(Instant::now(), deadline);

        // A take that fails wakes its waiters at once, with no decision.
        let waiting = tokio::spawn({
            let (leases, key, limit) = (leases.clone(), key.clone(), limit.clone());
            let deadline = Instant::now() + Duration::from_secs(1);
            async move { leases.wait_for_block(&key, &limit, 1, deadline).await }
        });
        tokio::time::advance(Duration::from_millis(5)).await;
        let failed_at = Instant::now();
        leases.failed(&key, &BackendError::Protocol("gone".into()));
        assert_eq!(waiting.await.expect("the waiting task"), None);
        assert_eq!(Instant::now(), failed_at);
        // With no take out, a hit does not wait.
        let deadline = Instant::now() + Duration::from_secs(1);
        assert_eq!(leases.wait_for_block(&key, &limit, 1, deadline).await, None);
        assert_eq!(Instant::now(), failed_at);
    }
}
