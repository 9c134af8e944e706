//! floodgate's Lua script, and how counter hits become one EVALSHA call.
//!
//! The algorithms in `lua/` are the Redis twins of `src/limiter/`: the same decisions,
//! computed atomically inside Redis with Redis' clock. They are joined with the batch driver
//! into one script, so that one call decides the hits of many requests: all those waiting on
//! a connection (or a cluster node) when it is sent. `lua/README.md` is the contract between
//! the two sides (layout, reply); this module is its Rust half.

use deadpool_redis::redis;

use crate::backend::BackendError;
use crate::limiter::{Algorithm, Decision, Hits, Limit, SECOND_MICROS};

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
    include_str!("../../../lua/prelude.lua"),
    include_str!("../../../lua/fixed_window.lua"),
    include_str!("../../../lua/sliding_window.lua"),
    include_str!("../../../lua/sliding_log.lua"),
    include_str!("../../../lua/token_bucket.lua"),
    include_str!("../../../lua/gcra.lua"),
    include_str!("../../../lua/all_or_nothing.lua"),
    include_str!("../../../lua/batch.lua"),
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

/// How a call's groups travel: the distinct limits, each sent once, and sections in group
/// order. Consecutive `Each` groups become one section of runs: their hits in an order where
/// hits of one limit are together (stable, so two hits of one counter, which share their
/// limit, keep their order), cut into runs of one limit and one cost. Hits of different
/// counters commute, so this order decides each counter as the call order would.
struct Plan<'a> {
    limits: Vec<&'a Limit>,
    sections: Vec<Section<'a>>,
}

enum Section<'a> {
    /// Hits decided one by one: `(call index, hit)` in the order sent, and the runs (limit
    /// number, cost, length) they form.
    Runs {
        hits: Vec<(usize, &'a RedisHit)>,
        runs: Vec<(usize, Cost, usize)>,
    },
    /// One all-or-nothing group: its hits, each with its limit number.
    All {
        first: usize,
        hits: Vec<(&'a RedisHit, usize)>,
    },
}

impl<'a> Plan<'a> {
    fn new(groups: &[Group<'a>]) -> Self {
        let mut limits: Vec<&'a Limit> = Vec::new();
        let mut number = |limit: &'a Limit| -> usize {
            let known = limits
                .iter()
                .position(|&known| std::ptr::eq(known, limit) || *known == *limit);
            1 + known.unwrap_or_else(|| {
                limits.push(limit);
                limits.len() - 1
            })
        };
        let mut sections = Vec::new();
        let mut index = 0;
        let mut rest = groups;
        while let Some(first) = rest.first() {
            let run = match first.mode {
                Mode::Each => rest.iter().take_while(|g| g.mode == Mode::Each).count(),
                Mode::AllOrNothing => 1,
            };
            let (these, after) = rest.split_at(run);
            let start = index;
            let hits = these.iter().flat_map(|g| g.hits.iter());
            index += these.iter().map(|g| g.hits.len()).sum::<usize>();
            sections.push(match first.mode {
                Mode::AllOrNothing => Section::All {
                    first: start,
                    hits: hits.map(|hit| (hit, number(&hit.limit))).collect(),
                },
                Mode::Each => {
                    let mut numbered: Vec<(usize, usize, &'a RedisHit)> = hits
                        .enumerate()
                        .map(|(i, hit)| (number(&hit.limit), start + i, hit))
                        .collect();
                    numbered.sort_by_key(|&(limit, _, _)| limit);
                    let mut runs: Vec<(usize, Cost, usize)> = Vec::new();
                    for &(limit, _, hit) in &numbered {
                        let cost = Cost(hit.hits);
                        match runs.last_mut() {
                            Some((l, c, len)) if *l == limit && *c == cost => *len += 1,
                            _ => runs.push((limit, cost, 1)),
                        }
                    }
                    Section::Runs {
                        hits: numbered.into_iter().map(|(_, i, hit)| (i, hit)).collect(),
                        runs,
                    }
                }
            });
            rest = after;
        }
        Plan { limits, sections }
    }
}

/// The EVALSHA that decides every group, in order, in one script call that reads the clock
/// once (`lua/batch.lua`). `local_now` is this process's clock, used only to compute calendar
/// windows around now (the script picks the one that contains Redis' time). A call that
/// runs after `deadline` (µs on the script's clock) decides nothing: [`Answer::Late`].
pub fn batch_call(
    scripts: &Scripts,
    groups: &[Group<'_>],
    target: Target,
    clock: ScriptClock,
    deadline: Option<u64>,
    local_now: u64,
) -> redis::Cmd {
    let plan = Plan::new(groups);
    let mut call = redis::cmd("EVALSHA");
    call.arg(scripts.batch.get_hash());
    match target {
        Target::Server => call.arg(0),
        Target::Slot => {
            // The keys the hits will touch by this process's clock; near a window's end
            // Redis' clock may pick the next one, which is in the same slot.
            let keys: Vec<String> = (groups.iter().flat_map(|g| g.hits))
                .flat_map(|hit| state_keys(&hit.key, &hit.limit, local_now))
                .collect();
            call.arg(keys.len()).arg(&keys[..])
        }
    };
    match clock {
        ScriptClock::Redis => call.arg(""),
        ScriptClock::Fixed(now) => call.arg(now),
    };
    match deadline {
        Some(deadline) => call.arg(deadline),
        None => call.arg(""),
    };
    call.arg(plan.limits.len());
    for limit in &plan.limits {
        call.arg(limit.algorithm.name())
            .arg(limit.requests_per_unit)
            .arg(limit.window_micros())
            .arg(limit.capacity())
            .arg(limit.token_interval_micros());
        match calendar_boundaries(limit, local_now) {
            Some(boundaries) => call.arg(&boundaries[..]),
            None => call.arg(&["", "", "", ""][..]),
        };
        call.arg(u8::from(limit.overshoot));
    }
    for section in &plan.sections {
        match section {
            Section::Runs { hits, runs } => {
                let mut keys = hits.iter().map(|(_, hit)| hit.key.as_str());
                for &(limit, cost, len) in runs {
                    call.arg("each").arg(len).arg(limit).arg(cost);
                    for key in keys.by_ref().take(len) {
                        call.arg(key);
                    }
                }
            }
            Section::All { hits, .. } => {
                call.arg("all").arg(hits.len());
                for &(hit, limit) in hits {
                    call.arg(&hit.key)
                        .arg(limit)
                        .arg(Cost(hit.hits))
                        .arg(u8::from(hit.binding));
                }
            }
        }
    }
    call
}

/// A hit's cost as the script reads it: the amount, negative for a give-back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cost(Hits);

impl redis::ToRedisArgs for Cost {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        let Cost(hits) = self;
        if hits.negative && hits.amount > 0 {
            out.write_arg_fmt(format_args!("-{}", hits.amount));
        } else {
            out.write_arg_fmt(hits.amount);
        }
    }
}

/// What a batch call's reply says: every hit's decision, or that Redis ran the call too late
/// to decide anything. The one reading of a reply, for the standalone lanes, the cluster's
/// own calls and the tests of the Lua contract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The call ran in time: one result per hit, in call order (a hit that failed has the
    /// error that failed it; in an all-or-nothing group, the one that failed the group), and
    /// per all-or-nothing group whether its hits were applied (`None`: the group failed).
    Decided {
        ran: RanAt,
        hits: Vec<Result<Decision, BackendError>>,
        applied: Vec<Option<bool>>,
    },
    /// The call ran at `ran_at` (the script's clock, µs), past its deadline: it decided
    /// nothing and wrote nothing.
    Late { ran_at: u64 },
}

/// When a call ran, on the script's clock (µs): when it started and when it finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RanAt {
    pub started: u64,
    pub finished: u64,
}

/// Reads a batch call's reply for `groups`, the groups the call was built from. A reply that
/// is no answer is an error for every hit: Redis' own error reply (the call did not run) as
/// unavailable, anything else as a protocol error.
pub fn read_reply(reply: &redis::Value, groups: &[Group<'_>]) -> Result<Answer, BackendError> {
    read_answer(reply, groups).map_err(|error| match reply {
        redis::Value::ServerError(_) => BackendError::Unavailable(error),
        _ => BackendError::Protocol(error),
    })
}

fn read_answer(reply: &redis::Value, groups: &[Group<'_>]) -> Result<Answer, String> {
    let plan = Plan::new(groups);
    let total = groups.iter().map(|g| g.hits.len()).sum();
    let mut reply = Reply(array(reply)?.iter().peekable());
    let started = reply.instant("its instant")?;
    if let Some(redis::Value::BulkString(text)) = reply.0.peek()
        && text.as_slice() == b"late"
    {
        reply.0.next();
        if let Some(extra) = reply.0.next() {
            return Err(format!("rate-limit script replied {extra:?} after 'late'"));
        }
        return Ok(Answer::Late { ran_at: started });
    }
    let finished = reply.instant("its end")?;
    // One decision per hit in call order; `None` for a hit that failed, whose message comes
    // after the numbers, in the order sent.
    let mut decisions: Vec<Option<Result<Decision, BackendError>>> = vec![None; total];
    let mut applied = Vec::new();
    // The call indices each message fails, in the order of the messages.
    let mut failures: Vec<Vec<usize>> = Vec::new();
    for section in &plan.sections {
        match section {
            Section::Runs { hits, .. } => {
                for &(index, _) in hits {
                    match reply.decision()? {
                        Some(decision) => decisions[index] = Some(Ok(decision)),
                        None => failures.push(vec![index]),
                    }
                }
            }
            Section::All { first, hits } => {
                let flag = match reply.integer("applied")? {
                    -1 => None,
                    0 => Some(false),
                    1 => Some(true),
                    other => return Err(format!("rate-limit script replied applied = {other}")),
                };
                applied.push(flag);
                let indices = *first..first + hits.len();
                for index in indices.clone() {
                    if let Some(decision) = reply.decision()? {
                        decisions[index] = Some(Ok(decision));
                    }
                }
                if flag.is_none() {
                    failures.push(indices.collect());
                }
            }
        }
    }
    for failed in failures {
        let error = BackendError::Unavailable(format!("redis: {}", reply.message()?));
        for index in failed {
            decisions[index] = Some(Err(error.clone()));
        }
    }
    if let Some(extra) = reply.0.next() {
        return Err(format!(
            "rate-limit script replied more than its calls: {extra:?}"
        ));
    }
    let hits = decisions
        .into_iter()
        .map(|decision| decision.ok_or_else(|| "no answer for a hit".to_owned()))
        .collect::<Result<_, _>>()?;
    Ok(Answer::Decided {
        ran: RanAt { started, finished },
        hits,
        applied,
    })
}

/// The items of a script's reply, read in order.
struct Reply<'a>(std::iter::Peekable<std::slice::Iter<'a, redis::Value>>);

impl Reply<'_> {
    /// The next item, an integer: `what` the script reports.
    fn integer(&mut self, what: &str) -> Result<i64, String> {
        match self.0.next() {
            Some(redis::Value::Int(n)) => Ok(*n),
            Some(other) => Err(format!(
                "rate-limit script replied {what} = {other:?}, not an integer"
            )),
            None => Err(format!("rate-limit script reply ends before {what}")),
        }
    }

    /// The next item, an instant on Redis' clock (µs).
    fn instant(&mut self, what: &str) -> Result<u64, String> {
        match self.0.next() {
            Some(redis::Value::Int(micros)) => non_negative(*micros, what),
            other => Err(format!(
                "rate-limit script replied {other:?} for {what}, not an integer"
            )),
        }
    }

    /// The next two items, a hit's code and reset: its decision, `None` when it failed.
    fn decision(&mut self) -> Result<Option<Decision>, String> {
        let code = self.integer("code")?;
        hit_decision(code, self.integer("reset")?)
    }

    /// The next item, a failed call's message.
    fn message(&mut self) -> Result<String, String> {
        match self.0.next() {
            Some(redis::Value::BulkString(bytes)) => {
                Ok(String::from_utf8_lossy(bytes).into_owned())
            }
            Some(redis::Value::SimpleString(text)) => Ok(text.clone()),
            other => Err(format!(
                "rate-limit script replied {other:?}, not a message"
            )),
        }
    }
}

/// One hit's two integers: `code` (remaining + 1 if allowed, -(remaining + 1) if rejected,
/// 0 if the hit failed) and the reset in µs; `None` for a failed hit.
fn hit_decision(code: i64, reset: i64) -> Result<Option<Decision>, String> {
    let reset_micros = non_negative(reset, "reset")?;
    if code == 0 {
        return Ok(None);
    }
    Ok(Some(Decision {
        allowed: code > 0,
        remaining: code.unsigned_abs() - 1,
        reset_micros,
    }))
}

fn non_negative(value: i64, what: &str) -> Result<u64, String> {
    u64::try_from(value).map_err(|_| format!("rate-limit script replied {what} = {value}, below 0"))
}

/// Appends a call of one hit to `pipe`: a batch of one, its keys declared, so that Redis
/// Cluster routes it by its slot.
pub fn add_call(
    pipe: &mut redis::Pipeline,
    scripts: &Scripts,
    hit: &RedisHit,
    clock: ScriptClock,
    deadline: Option<u64>,
    local_now: u64,
) {
    let group = [Group {
        mode: Mode::Each,
        hits: std::slice::from_ref(hit),
    }];
    pipe.add_command(batch_call(
        scripts,
        &group,
        Target::Slot,
        clock,
        deadline,
        local_now,
    ));
}

/// Reads the reply to [`add_call`]: the one hit's decision, or its error (a call Redis ran
/// past its deadline is [`BackendError::Late`]: its request has been answered already).
pub fn decision(reply: &redis::Value) -> Result<Decision, BackendError> {
    // The reading needs only the call's shape: one hit, decided on its own.
    let hit = RedisHit {
        key: String::new(),
        limit: Limit::per(1, crate::limiter::Unit::Second),
        hits: Hits::take(1),
        binding: true,
    };
    let group = [Group {
        mode: Mode::Each,
        hits: std::slice::from_ref(&hit),
    }];
    match read_reply(reply, &group)? {
        Answer::Decided { mut hits, .. } => hits
            .pop()
            .unwrap_or_else(|| Err(BackendError::Protocol("no reply to the script call".into()))),
        Answer::Late { .. } => Err(BackendError::Late),
    }
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

/// The items of the script's array reply.
fn array(reply: &redis::Value) -> Result<&[redis::Value], String> {
    match reply {
        redis::Value::Array(items) => Ok(items),
        redis::Value::ServerError(error) => Err(format!("rate-limit script failed: {error}")),
        other => Err(format!("rate-limit script replied {other:?}, not an array")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Timezone, Unit};
    use redis::Value;

    /// The instant every test reply ran at.
    const NOW: i64 = 1_700_000_000_000_000;

    /// A reply of the script that ran and finished at [`NOW`]: the two instants, then
    /// `values`.
    fn reply(values: &[i64]) -> Value {
        Value::Array(
            [NOW, NOW]
                .into_iter()
                .chain(values.iter().copied())
                .map(Value::Int)
                .collect(),
        )
    }

    fn text(message: &str) -> Value {
        Value::BulkString(message.as_bytes().to_vec())
    }

    /// The arguments of `call` after EVALSHA and the SHA1, as text.
    fn arguments(call: &redis::Cmd) -> Vec<String> {
        call.args_iter()
            .skip(2)
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => "<cursor>".into(),
            })
            .collect()
    }

    #[test]
    fn a_code_and_a_reset_are_a_decision() {
        assert_eq!(
            decision(&reply(&[5, 250_000])),
            Ok(Decision {
                allowed: true,
                remaining: 4,
                reset_micros: 250_000
            })
        );
        assert_eq!(
            decision(&reply(&[-1, 7])),
            Ok(Decision {
                allowed: false,
                remaining: 0,
                reset_micros: 7
            })
        );
    }

    #[test]
    fn an_unexpected_reply_is_an_error_naming_what_is_wrong() {
        let cases = [
            (reply(&[1]), "ends before reset"),
            (reply(&[1, -1]), "reset = -1"),
            (reply(&[1, 1, 7]), "more than its calls"),
            (reply(&[0, 0]), "not a message"),
            (Value::Nil, "not an array"),
            (Value::Array(vec![]), "for its instant"),
            (
                Value::Array(vec![Value::Int(-1), Value::Int(1)]),
                "instant = -1",
            ),
            (Value::Array(vec![Value::Int(NOW)]), "for its end"),
            (
                Value::Array(vec![Value::Int(NOW), Value::Int(NOW), text("7")]),
                "code",
            ),
            (
                Value::Array(vec![Value::Int(NOW), text("late"), Value::Int(0)]),
                "after 'late'",
            ),
            (
                Value::Array(vec![Value::Int(NOW), text("late")]),
                "past its deadline",
            ),
        ];
        for (value, expected) in cases {
            let error = decision(&value).expect_err("not a decision").to_string();
            assert!(error.contains(expected), "{error:?} lacks {expected:?}");
        }
    }

    #[test]
    fn a_failed_hit_gets_its_own_message_and_the_others_their_decisions() {
        let limit = Limit::per(5, Unit::Second);
        let hit = |key| RedisHit {
            binding: true,
            ..planned(key, &limit, Hits::take(1))
        };
        let each = [hit("a"), hit("b")];
        let all = [hit("c"), hit("d")];
        let groups = [
            Group {
                mode: Mode::Each,
                hits: &each,
            },
            Group {
                mode: Mode::AllOrNothing,
                hits: &all,
            },
        ];
        let mut items: Vec<Value> = [NOW, NOW, 5, 10, 0, 0, -1, 0, 0, 0, 0]
            .into_iter()
            .map(Value::Int)
            .collect();
        items.extend([text("WRONGTYPE b"), text("boom")]);
        let Ok(Answer::Decided { hits, applied, .. }) = read_reply(&Value::Array(items), &groups)
        else {
            panic!("a decided call");
        };
        assert_eq!(applied, [None]);
        let failed = |message: &str| Err(BackendError::Unavailable(format!("redis: {message}")));
        assert_eq!(
            hits,
            [
                Ok(Decision {
                    allowed: true,
                    remaining: 4,
                    reset_micros: 10
                }),
                failed("WRONGTYPE b"),
                failed("boom"),
                failed("boom"),
            ]
        );
    }

    fn planned(key: &str, limit: &Limit, hits: Hits) -> RedisHit {
        RedisHit {
            key: key.to_owned(),
            limit: limit.clone(),
            hits,
            binding: false,
        }
    }

    #[test]
    fn limits_are_sent_once_and_runs_of_one_limit_and_cost_share_a_header() {
        let per_second = Limit::per(5, Unit::Second);
        let gcra = Limit {
            algorithm: Algorithm::Gcra,
            ..Limit::per(5, Unit::Second)
        };
        // An equal limit is sent once.
        let equal = per_second.clone();
        let first = [
            planned("a", &per_second, Hits::take(1)),
            planned("b", &gcra, Hits::give_back(3)),
        ];
        let second = [
            planned("c", &equal, Hits::take(1)),
            planned("d", &gcra, Hits::take(2)),
        ];
        let third = [planned("e", &gcra, Hits::take(1))];
        let groups = [
            Group {
                mode: Mode::Each,
                hits: &first,
            },
            Group {
                mode: Mode::Each,
                hits: &second,
            },
            Group {
                mode: Mode::AllOrNothing,
                hits: &third,
            },
        ];
        let call = batch_call(
            &Scripts::new(),
            &groups,
            Target::Server,
            ScriptClock::Redis,
            Some(42),
            0,
        );
        #[rustfmt::skip]
        let expected = [
            "0", "", "42", "2",
            "fixed_window", "5", "1000000", "5", "200000", "", "", "", "", "0",
            "gcra", "5", "1000000", "5", "200000", "", "", "", "", "0",
            "each", "2", "1", "1", "a", "c",
            "each", "1", "2", "-3", "b",
            "each", "1", "2", "2", "d",
            "all", "1", "e", "2", "1", "0",
        ];
        assert_eq!(arguments(&call), expected);
        // The reply comes in the order sent; each hit gets its own answer back.
        let sent_order = [5, 7, 9, 11];
        let mut items: Vec<Value> = [Value::Int(NOW), Value::Int(NOW)]
            .into_iter()
            .chain(
                sent_order
                    .iter()
                    .flat_map(|&code| [Value::Int(code), Value::Int(0)]),
            )
            .collect();
        items.extend([Value::Int(1), Value::Int(13), Value::Int(0)]);
        let Ok(Answer::Decided { hits, .. }) = read_reply(&Value::Array(items), &groups) else {
            panic!("a decided call");
        };
        let remaining: Vec<u64> = hits
            .iter()
            .map(|d| d.as_ref().expect("a decision").remaining)
            .collect();
        // a, b, c, d, e in call order: a=4, c=6 (the first run), b=8, d=10, e=12.
        assert_eq!(remaining, [4, 8, 6, 10, 12]);
    }

    #[test]
    fn a_call_past_its_deadline_answers_late_with_its_instant_and_no_decision() {
        let limit = Limit::per(5, Unit::Second);
        let hits = [planned("a", &limit, Hits::take(1))];
        let groups = [Group {
            mode: Mode::Each,
            hits: &hits,
        }];
        let late = Value::Array(vec![Value::Int(NOW), text("late")]);
        assert_eq!(
            read_reply(&late, &groups),
            Ok(Answer::Late { ran_at: NOW as u64 })
        );
        let decided = read_reply(&reply(&[5, 10]), &groups).expect("an answer");
        let at = NOW as u64;
        assert!(
            matches!(decided, Answer::Decided { ran, .. } if ran == RanAt { started: at, finished: at }),
            "{decided:?}"
        );
        // Without a deadline the call goes out with an empty one.
        let call = batch_call(
            &Scripts::new(),
            &groups,
            Target::Server,
            ScriptClock::Fixed(7),
            None,
            0,
        );
        assert_eq!(arguments(&call)[..4], ["0", "7", "", "1"]);
    }

    #[test]
    fn a_hit_that_failed_is_unavailable_with_its_message_and_a_bad_reply_a_protocol_error() {
        let failed = Value::Array(vec![
            Value::Int(1_700_000_000_000_000),
            Value::Int(1_700_000_000_000_000),
            Value::Int(0),
            Value::Int(0),
            Value::BulkString(b"Script attempted to access a non local key".to_vec()),
        ]);
        assert!(matches!(
            decision(&failed),
            Err(BackendError::Unavailable(message)) if message.contains("non local key")
        ));
        let decided = Value::Array(vec![
            Value::Int(1_700_000_000_000_000),
            Value::Int(1_700_000_000_000_000),
            Value::Int(5),
            Value::Int(10),
        ]);
        assert_eq!(
            decision(&decided),
            Ok(Decision {
                allowed: true,
                remaining: 4,
                reset_micros: 10
            })
        );
        assert!(matches!(
            decision(&Value::Nil),
            Err(BackendError::Protocol(_))
        ));
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

#[cfg(test)]
mod declared {
    use super::*;
    use crate::limiter::Unit;

    #[test]
    fn a_call_routed_by_slot_declares_every_key_a_sliding_log_has_two() {
        let log = Limit {
            algorithm: Algorithm::SlidingLog,
            ..Limit::per(5, Unit::Second)
        };
        let mut pipe = redis::pipe();
        let hit = RedisHit {
            key: "{t}:k".into(),
            limit: log,
            hits: Hits::take(1),
            binding: true,
        };
        add_call(
            &mut pipe,
            &Scripts::new(),
            &hit,
            ScriptClock::Redis,
            None,
            0,
        );
        let command = pipe.cmd_iter().next().expect("one command");
        let declared: Vec<Vec<u8>> = command
            .args_iter()
            .skip(2)
            .take(3)
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => bytes.to_vec(),
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(declared, [&b"2"[..], b"{t}:k:log", b"{t}:k:n"]);
    }
}
