//! Counting: what a limit is, what a hit costs, and the five algorithms that decide.
//!
//! Each algorithm lives in its own file with the same name as its Lua twin in `lua/`; both
//! are driven by one table of cases (`tests/common/cases.rs`). The math is integer
//! microseconds throughout so the Lua scripts (doubles, exact to 2^53) reproduce it bit for
//! bit. See `docs/algorithms.md` for the definitions of remaining and reset.

mod calendar;
mod counter;
mod fixed_window;
mod gcra;
pub mod key;
mod sliding_log;
mod sliding_window;
mod tally;
mod token_bucket;

pub use calendar::Timezone;
pub use counter::Counter;
pub use key::CounterKey;

/// One second in microseconds.
pub const SECOND_MICROS: u64 = 1_000_000;

/// Hits above this are clamped: any cost larger than every `u32` limit is rejected anyway, and
/// the clamp keeps the Lua twin inside exact double arithmetic.
pub const MAX_HITS: u64 = u32::MAX as u64 + 1;

/// The unit of a window. Month is 30 days and year 365 days, as in envoyproxy/ratelimit,
/// unless a [`Timezone`] makes the window calendar-aligned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    /// The unit's length in seconds.
    pub const fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    /// The lower-case name used in rule files.
    pub const fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// Parses a unit name, case-insensitively (envoyproxy/ratelimit accepts `SECOND`).
    pub fn parse(name: &str) -> Option<Unit> {
        const ALL: [Unit; 7] = [
            Unit::Second,
            Unit::Minute,
            Unit::Hour,
            Unit::Day,
            Unit::Week,
            Unit::Month,
            Unit::Year,
        ];
        ALL.into_iter()
            .find(|unit| unit.name().eq_ignore_ascii_case(name))
    }
}

/// How a counter counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub enum Algorithm {
    /// Epoch-aligned (or calendar-aligned) windows; a burst of up to twice the limit is
    /// possible across a window boundary.
    #[default]
    FixedWindow,
    /// Two fixed-window counters, the previous one weighted by how much of it still overlaps
    /// the sliding window.
    SlidingWindow,
    /// Every hit with its timestamp; exact, memory grows with the hits of one window.
    SlidingLog,
    /// A bucket of `burst` tokens refilled at `requests_per_unit` per window, in whole tokens.
    TokenBucket,
    /// Generic cell rate algorithm: one theoretical arrival time per counter.
    Gcra,
    /// A sum kept for one window from its first hit, never refused: RLQS' demand, not a
    /// rule's (rule files cannot name it, and [`Algorithm::ALL`] leaves it out).
    Tally,
}

impl Algorithm {
    /// The algorithms a rule can count with.
    pub const ALL: [Algorithm; 5] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
    ];

    /// Every algorithm a store counts with: the rules' and the tally.
    pub const COUNTED: [Algorithm; 6] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::Tally,
    ];

    /// The snake_case name used in rule files, keys and the Lua file names.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::Gcra => "gcra",
            Algorithm::Tally => "tally",
        }
    }

    pub fn parse(name: &str) -> Option<Algorithm> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }
}

/// The counting parameters of one limit: everything a counter needs to decide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    /// Requests allowed per window; 0 blocks every hit that costs something.
    pub requests_per_unit: u32,
    pub unit: Unit,
    /// The window is `unit_multiplier` units long; at least 1.
    pub unit_multiplier: u32,
    pub algorithm: Algorithm,
    /// token_bucket / gcra: the most requests allowed at once. `None` means
    /// `requests_per_unit`.
    pub burst: Option<u32>,
    /// fixed_window only: windows of a day, week, month or year start at local midnight.
    pub timezone: Option<Timezone>,
    /// Every hit that takes quota is counted in full, even past the limit (usage charged
    /// after the fact: an LLM response's tokens); over the limit, even a check is refused
    /// until the algorithm brings the count back within it.
    pub overshoot: bool,
    /// A replica takes blocks of this limit's quota from a shared store and decides its hits
    /// from them in process (`lease: true`; docs/algorithms.md, "Leases"). Fixed window and
    /// token bucket only; the memory store, local already, ignores it.
    pub lease: bool,
}

impl Limit {
    /// A fixed-window limit of `requests_per_unit` per one `unit`.
    pub fn per(requests_per_unit: u32, unit: Unit) -> Self {
        Limit {
            requests_per_unit,
            unit,
            unit_multiplier: 1,
            algorithm: Algorithm::FixedWindow,
            burst: None,
            timezone: None,
            overshoot: false,
            lease: false,
        }
    }

    /// The window length in microseconds (the nominal length for calendar windows).
    pub fn window_micros(&self) -> u64 {
        // Saturates instead of overflowing: a multiplier no rule file should carry must still
        // not panic.
        self.unit
            .seconds()
            .saturating_mul(u64::from(self.unit_multiplier.max(1)))
            .saturating_mul(SECOND_MICROS)
    }

    /// token_bucket / gcra: microseconds between two tokens, `W / requests_per_unit`
    /// truncated and at least 1 µs, so at most 10^6 tokens per second come back.
    pub fn token_interval_micros(&self) -> u64 {
        (self.window_micros() / u64::from(self.requests_per_unit.max(1))).max(1)
    }

    /// The bucket capacity of token_bucket / gcra.
    pub fn capacity(&self) -> u64 {
        u64::from(self.burst.unwrap_or(self.requests_per_unit))
    }

    /// How far ahead of now a counter's state can reach: the window, or for token_bucket /
    /// gcra the time an empty bucket takes to fill. Rules keep it within [`MAX_SPAN_MICROS`].
    pub fn span_micros(&self) -> u64 {
        match self.algorithm {
            Algorithm::TokenBucket | Algorithm::Gcra => self
                .window_micros()
                .max(self.capacity().saturating_mul(self.token_interval_micros())),
            _ => self.window_micros(),
        }
    }
}

/// The longest [`Limit::span_micros`] a rule may have: 100 years. It keeps every timestamp
/// the algorithms compute below 2^53 µs, where the Lua twins' doubles are still exact.
pub const MAX_SPAN_MICROS: u64 = 100 * 365 * 86_400 * SECOND_MICROS;

/// What one hit costs a counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hits {
    /// How many units of quota; 0 only checks. Clamped to [`MAX_HITS`].
    pub amount: u64,
    /// The hits are given back instead of taken (never below an empty counter).
    pub negative: bool,
}

impl Hits {
    pub fn take(amount: u64) -> Self {
        Hits {
            amount: amount.min(MAX_HITS),
            negative: false,
        }
    }

    /// A give-back of `amount`; of nothing, a check (which is how the Lua twin reads it: a
    /// cost's sign is all that says "give back").
    pub fn give_back(amount: u64) -> Self {
        Hits {
            amount: amount.min(MAX_HITS),
            negative: amount > 0,
        }
    }
}

/// A counter's answer to one hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// The hit fits: the count after it is not above the limit. A rejected hit is not counted.
    pub allowed: bool,
    /// Quota left after the hit.
    pub remaining: u64,
    /// Microseconds until the next unit of quota comes back (see `docs/algorithms.md`).
    pub reset_micros: u64,
}
