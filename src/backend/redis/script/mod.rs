//! floodgate's Lua script, and how counter hits become one EVALSHA call.
//!
//! The algorithms in `lua/` are the Redis twins of `src/limiter/`: the same decisions,
//! computed atomically inside Redis with Redis' clock. They are joined with the batch driver
//! into one script, so that one call decides the hits of many requests: all those waiting on
//! a connection (or a cluster node) when it is sent. `lua/README.md` is the contract between
//! the two sides (layout, reply); this module is its Rust half.
//!
//! The rooms: this file holds the script and the vocabulary both sides share (a hit, its
//! group, where the call runs, the keys a counter's state lives under); `call.rs` builds a
//! call, `reply.rs` reads its reply.

mod call;
mod reply;
#[cfg(test)]
mod tests;

use deadpool_redis::redis;

use crate::limiter::{Algorithm, Hits, Limit, SECOND_MICROS};

use call::calendar_boundaries;
pub use call::{add_call, batch_call};
pub use reply::{Answer, RanAt, decision, read_reply};

/// Where a script reads the time: Redis' own clock in production; a fixed instant in tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptClock {
    /// `redis.call('TIME')`: one clock for every replica.
    Redis,
    /// This instant, in microseconds since the epoch (tests drive the case table with it).
    Fixed(u64),
}

/// floodgate's one script (the five algorithms, the all-or-nothing undo log and the batch
/// driver) with its SHA1, built once at start-up.
pub struct Scripts {
    batch: redis::Script,
}

impl Scripts {
    pub fn new() -> Self {
        Scripts {
            batch: redis::Script::new(SOURCE),
        }
    }

    /// Every script, for SCRIPT LOAD: there is one.
    pub fn all(&self) -> impl Iterator<Item = &redis::Script> {
        std::iter::once(&self.batch)
    }
}

impl Default for Scripts {
    fn default() -> Self {
        Self::new()
    }
}

/// The script's source, compiled into the binary: the prelude (the cross-slot flag, the
/// clock, shared helpers), each algorithm, the all-or-nothing undo log, then the batch
/// driver that reads the call and runs them.
const SOURCE: &str = concat!(
    include_str!("../../../../lua/prelude.lua"),
    include_str!("../../../../lua/fixed_window.lua"),
    include_str!("../../../../lua/sliding_window.lua"),
    include_str!("../../../../lua/sliding_log.lua"),
    include_str!("../../../../lua/token_bucket.lua"),
    include_str!("../../../../lua/gcra.lua"),
    include_str!("../../../../lua/tally.lua"),
    include_str!("../../../../lua/all_or_nothing.lua"),
    include_str!("../../../../lua/batch.lua"),
);

/// The two keys of a sliding log: its entries (a sorted set) and the hits they hold. Both
/// keep the counter key's `{…}` hash tag, so they live in one cluster slot. The script
/// derives them the same way (`log_keys` in `lua/sliding_log.lua`).
pub fn log_keys(key: &str) -> [String; 2] {
    [format!("{key}:log"), format!("{key}:n")]
}

/// One counter hit as Redis takes it, from the connection's queue to the script's arguments:
/// the counter's full Redis key (the settings' prefix, then the counter key), its limit, the
/// hit, and whether its rejection rejects its request (read in an all-or-nothing group
/// only). Owned, since a task of its own sends the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisHit {
    pub key: String,
    pub limit: Limit,
    pub hits: Hits,
    pub binding: bool,
}

/// How the script decides a group of hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Each hit on its own, in order.
    Each,
    /// One request's hits, applied only if no binding one is rejected.
    AllOrNothing,
}

/// Hits decided one way: one request's, or (consecutive `Each` groups travel as one) the
/// hits of several requests that are decided hit by hit.
#[derive(Debug, Clone, Copy)]
pub struct Group<'a> {
    pub mode: Mode,
    pub hits: &'a [RedisHit],
}

/// Where a call runs, which decides the keys it declares. The script reads every key from
/// ARGV; declared keys only tell Redis Cluster where the call belongs, and must be the keys
/// the script touches: a cluster checks declared keys for a slot in migration (ASK,
/// TRYAGAIN), and refuses an undeclared key that has moved away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The server that holds every key: a standalone Redis, or the cluster node that serves
    /// the slots of them all (the caller routes the call there, and the script's cross-slot
    /// flag lets it touch keys of several slots). No keys are declared; a hit whose key the
    /// node no longer serves fails on its first read, before it wrote anything.
    Server,
    /// Every key in one slot: all declared, so the cluster routes and redirects the call
    /// (MOVED, ASK, TRYAGAIN) as it does any single-slot command, before anything runs.
    Slot,
}

/// The Redis keys that hold a counter's state when a hit at `now_micros` reads it: the
/// counter key; a fixed window's key for the window containing `now_micros`; a sliding log's
/// two keys.
pub fn state_keys(key: &str, limit: &Limit, now_micros: u64) -> Vec<String> {
    match limit.algorithm {
        Algorithm::FixedWindow => {
            let ends = match calendar_boundaries(limit, now_micros) {
                Some([_, start, _, _]) if now_micros < start => start,
                Some([_, _, end, next]) if now_micros >= end => next,
                Some([_, _, end, _]) => end,
                None => {
                    let window = limit.window_micros().max(1);
                    now_micros - now_micros % window + window
                }
            };
            vec![window_key(key, ends)]
        }
        Algorithm::SlidingLog => log_keys(key).into(),
        _ => vec![key.to_owned()],
    }
}

/// Every key a hit on the counter `key` would use now, a window ago or a window ahead: what
/// a reset deletes, so that a clock a little apart from Redis' misses no fixed window.
pub fn nearby_state_keys(key: &str, limit: &Limit, now_micros: u64) -> Vec<String> {
    let window = limit.window_micros();
    let instants = [
        now_micros.saturating_sub(window),
        now_micros,
        now_micros.saturating_add(window),
    ];
    let mut keys: Vec<String> = (instants.iter())
        .flat_map(|&at| state_keys(key, limit, at))
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// The key of a fixed window's count, named as `window_key` in `lua/fixed_window.lua` does.
fn window_key(key: &str, ends_micros: u64) -> String {
    if ends_micros.is_multiple_of(SECOND_MICROS) {
        format!("{key}:{}", ends_micros / SECOND_MICROS)
    } else {
        format!("{key}:{ends_micros}us")
    }
}
