//! Drives the Lua script the way the Redis backend does (`batch_call`, `read_reply`), at an
//! instant the test chooses: one hit per round trip, one all-or-nothing request, or a batch.

#![allow(dead_code)]

use deadpool_redis::redis;
use deadpool_redis::redis::aio::ConnectionLike;
use floodgate::backend::redis::script::{
    Answer, Group, Mode, RedisHit, ScriptClock, Scripts, Target, add_call, batch_call, decision,
    read_reply,
};
use floodgate::limiter::{Decision, Hits, Limit};

/// SCRIPT LOADs every script, so EVALSHA finds them (on a cluster connection: on every node).
pub async fn load<C: ConnectionLike>(connection: &mut C, scripts: &Scripts) {
    for script in scripts.all() {
        script
            .load_async(connection)
            .await
            .expect("SCRIPT LOAD succeeds");
    }
}

/// One hit on the counter `key` at `now` (also the local clock for calendar windows).
pub async fn hit<C: ConnectionLike>(
    connection: &mut C,
    scripts: &Scripts,
    key: &str,
    limit: &Limit,
    hits: Hits,
    now: u64,
) -> Result<Decision, String> {
    call(
        connection,
        scripts,
        key,
        limit,
        hits,
        ScriptClock::Fixed(now),
        now,
    )
    .await
}

/// One hit through `add_call` and `decision`, as the Redis backend makes it.
pub async fn call<C: ConnectionLike>(
    connection: &mut C,
    scripts: &Scripts,
    key: &str,
    limit: &Limit,
    hits: Hits,
    clock: ScriptClock,
    local_now: u64,
) -> Result<Decision, String> {
    let mut pipe = redis::pipe();
    let hit = RedisHit {
        key: key.to_owned(),
        limit: limit.clone(),
        hits,
        binding: true,
    };
    add_call(&mut pipe, scripts, &hit, clock, None, local_now);
    let replies: Vec<redis::Value> = pipe
        .query_async(connection)
        .await
        .map_err(|e| format!("EVALSHA failed: {e}"))?;
    match replies.as_slice() {
        [reply] => decision(reply).map_err(|e| e.to_string()),
        other => Err(format!("one call, {} replies", other.len())),
    }
}

/// One all-or-nothing call of `planned` at `now`, as the Redis backend makes it: whether the
/// hits were applied, and each one's decision.
pub async fn all_or_nothing<C: ConnectionLike>(
    connection: &mut C,
    scripts: &Scripts,
    planned: &[RedisHit],
    now: u64,
) -> Result<(bool, Vec<Decision>), String> {
    let group = [Group {
        mode: Mode::AllOrNothing,
        hits: planned,
    }];
    let reply = batch(connection, scripts, &group, now).await?;
    let decisions = reply.decisions.into_iter().collect::<Result<Vec<_>, _>>()?;
    match reply.applied.as_slice() {
        [Some(applied)] => Ok((*applied, decisions)),
        other => Err(format!("all-or-nothing group answered {other:?}")),
    }
}

/// What a batch call decided: each hit's decision (or error message), and each
/// all-or-nothing group's `applied`.
#[derive(Debug)]
pub struct Batch {
    pub decisions: Vec<Result<Decision, String>>,
    pub applied: Vec<Option<bool>>,
}

/// One batch call of `groups` at `now`, as the Redis backend makes it.
pub async fn batch<C: ConnectionLike>(
    connection: &mut C,
    scripts: &Scripts,
    groups: &[Group<'_>],
    now: u64,
) -> Result<Batch, String> {
    match answer(connection, scripts, groups, now, None).await? {
        Answer::Decided { hits, applied, .. } => Ok(Batch {
            decisions: (hits.into_iter())
                .map(|hit| hit.map_err(|e| e.to_string()))
                .collect(),
            applied,
        }),
        late => Err(format!("a call without a deadline answered {late:?}")),
    }
}

/// One batch call of `groups` at `now` with a `deadline` on the same clock: its decisions, or
/// that it was late.
pub async fn answer<C: ConnectionLike>(
    connection: &mut C,
    scripts: &Scripts,
    groups: &[Group<'_>],
    now: u64,
    deadline: Option<u64>,
) -> Result<Answer, String> {
    let command = batch_call(
        scripts,
        groups,
        Target::Server,
        ScriptClock::Fixed(now),
        deadline,
        now,
    );
    let mut pipe = redis::pipe();
    pipe.ignore_errors().add_command(command);
    let replies: Vec<redis::Value> = pipe
        .query_async(connection)
        .await
        .map_err(|e| format!("EVALSHA failed: {e}"))?;
    read_reply(&replies[0], groups).map_err(|e| e.to_string())
}
