//! Reading a call's reply: the instants the script ran at, then each hit's decision (or
//! error) in call order, or the word that it ran past its deadline.

use deadpool_redis::redis;

use super::call::{Plan, Section};
use super::{Group, Mode, RedisHit};
use crate::backend::BackendError;
use crate::limiter::{Decision, Hits, Limit};

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

/// Reads the reply to [`add_call`](super::add_call): the one hit's decision, or its error (a call Redis ran
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

/// The items of the script's array reply.
fn array(reply: &redis::Value) -> Result<&[redis::Value], String> {
    match reply {
        redis::Value::Array(items) => Ok(items),
        redis::Value::ServerError(error) => Err(format!("rate-limit script failed: {error}")),
        other => Err(format!("rate-limit script replied {other:?}, not an array")),
    }
}
