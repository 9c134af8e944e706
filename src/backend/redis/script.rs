//! The Lua script of each algorithm, and how one counter hit becomes one EVALSHA call.
//!
//! The scripts in `lua/` are the Redis twins of `src/limiter/`: the same decisions, computed
//! atomically inside Redis with Redis' clock. `lua/README.md` is the contract between the
//! two sides (keys, arguments, reply); this module is its Rust half.

use deadpool_redis::redis;

use crate::limiter::{Algorithm, Decision, Hits, Limit};

/// Where a script reads the time: Redis' own clock in production; a fixed instant in tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptClock {
    /// `redis.call('TIME')`: one clock for every replica.
    Redis,
    /// This instant, in microseconds since the epoch (tests drive the case table with it).
    Fixed(u64),
}

/// The five scripts, and the one that runs a whole request all or nothing, with their
/// SHA1s, built once at start-up.
pub struct Scripts {
    scripts: Vec<(Algorithm, redis::Script)>,
    all_or_nothing: redis::Script,
}

impl Scripts {
    pub fn new() -> Self {
        let scripts = Algorithm::ALL
            .into_iter()
            .map(|algorithm| (algorithm, redis::Script::new(source(algorithm))))
            .collect();
        Scripts {
            scripts,
            all_or_nothing: redis::Script::new(ALL_OR_NOTHING_SOURCE),
        }
    }

    /// The script of `algorithm`.
    pub fn get(&self, algorithm: Algorithm) -> &redis::Script {
        &self
            .scripts
            .iter()
            .find(|(a, _)| *a == algorithm)
            .expect("every algorithm has a script")
            .1
    }

    /// Every script, for SCRIPT LOAD.
    pub fn all(&self) -> impl Iterator<Item = &redis::Script> {
        self.scripts
            .iter()
            .map(|(_, script)| script)
            .chain([&self.all_or_nothing])
    }
}

impl Default for Scripts {
    fn default() -> Self {
        Self::new()
    }
}

/// One script's source, compiled into the binary: the shared prelude (argument reading and
/// the clock), then the algorithm's body.
macro_rules! script_source {
    ($name:literal) => {
        concat!(
            include_str!("../../../lua/prelude.lua"),
            include_str!(concat!("../../../lua/", $name, ".lua"))
        )
    };
}

/// The all-or-nothing script: its driver, then every algorithm's script (prelude and body,
/// unchanged) as a function of its own KEYS and ARGV, in a table by algorithm name. Each
/// algorithm's script ends in `return`, which now returns from its function.
macro_rules! algorithm_function {
    ($name:literal) => {
        concat!(
            $name,
            " = function(KEYS, ARGV, redis)\n",
            script_source!($name),
            "\nend,\n"
        )
    };
}

const ALL_OR_NOTHING_SOURCE: &str = concat!(
    include_str!("../../../lua/all_or_nothing.lua"),
    "\nreturn all_or_nothing({\n",
    algorithm_function!("fixed_window"),
    algorithm_function!("sliding_window"),
    algorithm_function!("sliding_log"),
    algorithm_function!("token_bucket"),
    algorithm_function!("gcra"),
    "})\n"
);

/// The Lua source of `algorithm`.
fn source(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow => script_source!("fixed_window"),
        Algorithm::SlidingWindow => script_source!("sliding_window"),
        Algorithm::SlidingLog => script_source!("sliding_log"),
        Algorithm::TokenBucket => script_source!("token_bucket"),
        Algorithm::Gcra => script_source!("gcra"),
    }
}

/// The second key of a sliding log: the sequence that numbers its members. It keeps the
/// counter key's `{…}` hash tag, so both keys live in one cluster slot.
pub fn sequence_key(key: &str) -> String {
    format!("{key}:seq")
}

/// Appends one EVALSHA for a hit on the counter `key` to `pipe`. `local_now` is this
/// process's clock, used only to compute calendar windows around now (the script picks the
/// one that contains Redis' time).
pub fn add_call(
    pipe: &mut redis::Pipeline,
    scripts: &Scripts,
    key: &str,
    limit: &Limit,
    hits: Hits,
    clock: ScriptClock,
    local_now: u64,
) {
    let mut call = redis::cmd("EVALSHA");
    call.arg(scripts.get(limit.algorithm).get_hash());
    if limit.algorithm == Algorithm::SlidingLog {
        call.arg(2).arg(key).arg(sequence_key(key));
    } else {
        call.arg(1).arg(key);
    }
    push_arguments(&mut call, limit, hits, clock, local_now);
    pipe.add_command(call);
}

/// The keys of one counter's script call: the counter key, and a sliding log's sequence.
fn keys(key: &str, algorithm: Algorithm) -> Vec<String> {
    if algorithm == Algorithm::SlidingLog {
        vec![key.to_owned(), sequence_key(key)]
    } else {
        vec![key.to_owned()]
    }
}

/// How many ARGV entries [`push_arguments`] sends: ARGV[1..11] of `lua/README.md`.
const ARGUMENTS: usize = 11;

/// Appends one hit's ARGV (all [`ARGUMENTS`] of them) to `call`.
fn push_arguments(
    call: &mut redis::Cmd,
    limit: &Limit,
    hits: Hits,
    clock: ScriptClock,
    local_now: u64,
) {
    call.arg(limit.requests_per_unit)
        .arg(limit.window_micros())
        .arg(hits.amount)
        .arg(u8::from(hits.negative))
        .arg(limit.capacity())
        .arg(limit.token_interval_micros());
    match clock {
        ScriptClock::Redis => call.arg(""),
        ScriptClock::Fixed(now) => call.arg(now),
    };
    match calendar_boundaries(limit, local_now) {
        Some(boundaries) => call.arg(&boundaries[..]),
        None => call.arg(&["", "", "", ""][..]),
    };
}

/// One hit of an all-or-nothing call: the counter's full Redis key, its limit, the hit, and
/// whether its rejection rejects the request.
#[derive(Debug, Clone, Copy)]
pub struct PlannedHit<'a> {
    pub key: &'a str,
    pub limit: &'a Limit,
    pub hits: Hits,
    pub binding: bool,
}

/// The EVALSHA that applies every hit of `planned`, in order, only if no binding one is
/// rejected: every call's keys in KEYS, then in ARGV the number of calls and, per call,
/// its algorithm, binding flag, key count, argument count and arguments (`lua/README.md`).
pub fn all_or_nothing_call(
    scripts: &Scripts,
    planned: &[PlannedHit<'_>],
    clock: ScriptClock,
    local_now: u64,
) -> redis::Cmd {
    let keys: Vec<Vec<String>> = planned
        .iter()
        .map(|hit| keys(hit.key, hit.limit.algorithm))
        .collect();
    let mut call = redis::cmd("EVALSHA");
    call.arg(scripts.all_or_nothing.get_hash())
        .arg(keys.iter().map(Vec::len).sum::<usize>());
    for keys in &keys {
        call.arg(&keys[..]);
    }
    call.arg(planned.len());
    for (hit, keys) in planned.iter().zip(&keys) {
        call.arg(hit.limit.algorithm.name())
            .arg(u8::from(hit.binding))
            .arg(keys.len())
            .arg(ARGUMENTS);
        push_arguments(&mut call, hit.limit, hit.hits, clock, local_now);
    }
    call
}

/// Reads the all-or-nothing script's reply, `[applied 0|1, decision…]`: whether the hits
/// were applied, and one decision per call (each as [`decision`] reads it).
pub fn all_or_nothing_reply(
    reply: &redis::Value,
    calls: usize,
) -> Result<(bool, Vec<Decision>), String> {
    let items = array(reply, "all-or-nothing script")?;
    let Some((applied, decisions)) = items.split_first() else {
        return Err("all-or-nothing script replied an empty array".into());
    };
    if decisions.len() != calls {
        return Err(format!(
            "all-or-nothing script replied {} decisions for {calls} calls",
            decisions.len()
        ));
    }
    let applied = match integer(applied, "applied")? {
        0 => false,
        1 => true,
        other => return Err(format!("all-or-nothing script replied applied = {other}")),
    };
    let decisions = decisions.iter().map(decision).collect::<Result<_, _>>()?;
    Ok((applied, decisions))
}

/// A calendar-aligned fixed window's boundaries b0 < b1 < b2 < b3 around `local_now`: the
/// previous, the current and the next window. Redis' clock may differ from this process's
/// by a little; the script picks the window that contains its own now.
fn calendar_boundaries(limit: &Limit, local_now: u64) -> Option<[u64; 4]> {
    let zone = match (&limit.timezone, limit.algorithm) {
        (Some(zone), Algorithm::FixedWindow) => zone,
        _ => return None,
    };
    let (start, end) = zone.window(limit.unit, local_now);
    let (previous, _) = zone.window(limit.unit, start.saturating_sub(1));
    let (_, next) = zone.window(limit.unit, end);
    Some([previous, start, end, next])
}

/// Reads one script's reply: `[allowed 0|1, remaining, reset_us]`, all integers.
pub fn decision(reply: &redis::Value) -> Result<Decision, String> {
    let items = array(reply, "rate-limit script")?;
    let [allowed, remaining, reset] = items else {
        return Err(format!(
            "rate-limit script replied {} values, not 3: {items:?}",
            items.len()
        ));
    };
    let allowed = match integer(allowed, "allowed")? {
        0 => false,
        1 => true,
        other => {
            return Err(format!(
                "rate-limit script replied allowed = {other}, not 0 or 1"
            ));
        }
    };
    Ok(Decision {
        allowed,
        remaining: integer(remaining, "remaining")?,
        reset_micros: integer(reset, "reset")?,
    })
}

/// The items of a script's array reply; `script` names the script in the error.
fn array<'v>(reply: &'v redis::Value, script: &str) -> Result<&'v [redis::Value], String> {
    match reply {
        redis::Value::Array(items) => Ok(items),
        redis::Value::ServerError(error) => Err(format!("{script} failed: {error}")),
        other => Err(format!("{script} replied {other:?}, not an array")),
    }
}

/// One non-negative integer of the reply; `what` names it in the error.
fn integer(value: &redis::Value, what: &str) -> Result<u64, String> {
    match value {
        redis::Value::Int(n) => u64::try_from(*n)
            .map_err(|_| format!("rate-limit script replied {what} = {n}, below 0")),
        other => Err(format!(
            "rate-limit script replied {what} = {other:?}, not an integer"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Timezone, Unit};
    use redis::Value;

    fn reply(values: &[i64]) -> Value {
        Value::Array(values.iter().copied().map(Value::Int).collect())
    }

    #[test]
    fn a_reply_of_three_integers_is_a_decision() {
        assert_eq!(
            decision(&reply(&[1, 4, 250_000])),
            Ok(Decision {
                allowed: true,
                remaining: 4,
                reset_micros: 250_000
            })
        );
        assert!(!decision(&reply(&[0, 0, 1])).expect("a decision").allowed);
    }

    #[test]
    fn an_unexpected_reply_is_an_error_naming_what_is_wrong() {
        let cases = [
            (reply(&[1, 2]), "2 values"),
            (reply(&[2, 0, 0]), "allowed = 2"),
            (reply(&[1, -1, 0]), "remaining = -1"),
            (Value::Nil, "not an array"),
            (
                Value::Array(vec![
                    Value::Int(1),
                    Value::BulkString(b"7".to_vec()),
                    Value::Int(0),
                ]),
                "remaining",
            ),
        ];
        for (value, expected) in cases {
            let error = decision(&value).expect_err("not a decision");
            assert!(error.contains(expected), "{error:?} lacks {expected:?}");
        }
    }

    #[test]
    fn every_algorithm_and_the_all_or_nothing_driver_have_their_own_script() {
        let scripts = Scripts::new();
        let mut hashes: Vec<&str> = scripts.all().map(|script| script.get_hash()).collect();
        hashes.sort_unstable();
        hashes.dedup();
        assert_eq!(hashes.len(), Algorithm::ALL.len() + 1);
    }

    #[test]
    fn a_call_sends_as_many_arguments_as_the_all_or_nothing_layout_says() {
        let mut pipe = redis::pipe();
        let limit = Limit::per(1, Unit::Second);
        add_call(
            &mut pipe,
            &Scripts::new(),
            "k",
            &limit,
            Hits::take(1),
            ScriptClock::Redis,
            0,
        );
        let command = pipe.cmd_iter().next().expect("one command");
        // EVALSHA, the SHA1, the key count and one key, then the arguments.
        assert_eq!(command.args_iter().count(), 4 + ARGUMENTS);
    }

    #[test]
    fn calendar_boundaries_are_the_previous_current_and_next_windows() {
        let paris = Timezone::parse("Europe/Paris").expect("Europe/Paris is in every tz database");
        let limit = Limit {
            timezone: Some(paris),
            ..Limit::per(1, Unit::Day)
        };
        let midnight = 1_711_839_600_000_000; // 2024-03-31T00:00+01:00, a 23-hour day
        let hour = 3_600_000_000;
        assert_eq!(
            calendar_boundaries(&limit, midnight + hour),
            Some([
                midnight - 24 * hour,
                midnight,
                midnight + 23 * hour,
                midnight + 47 * hour
            ])
        );
        assert_eq!(calendar_boundaries(&Limit::per(1, Unit::Day), 0), None);
    }
}
