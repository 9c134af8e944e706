//! Building a call: counter hits, grouped by request, become one EVALSHA of the batch
//! script (`lua/batch.lua`'s layout: the clock, the deadline, the limits, then the groups).

use deadpool_redis::redis;

use super::{Group, Mode, RedisHit, ScriptClock, Scripts, Target, state_keys};
use crate::limiter::{Algorithm, Hits, Limit};

/// How a call's groups travel: the distinct limits, each sent once, and sections in group
/// order. Consecutive `Each` groups become one section of runs: their hits in an order where
/// hits of one limit are together (stable, so two hits of one counter, which share their
/// limit, keep their order), cut into runs of one limit and one cost, short runs of one limit
/// pooled into one where each hit names its cost. Hits of different counters commute, so
/// this order decides each counter as the call order would.
pub(super) struct Plan<'a> {
    limits: Vec<&'a Limit>,
    pub(super) sections: Vec<Section<'a>>,
}

pub(super) enum Section<'a> {
    /// Hits decided one by one: `(call index, hit)` in the order sent, and the runs they
    /// form.
    Runs {
        hits: Vec<(usize, &'a RedisHit)>,
        runs: Vec<Run>,
    },
    /// One all-or-nothing group: its hits, each with its limit number.
    All {
        first: usize,
        hits: Vec<(&'a RedisHit, usize)>,
    },
}

impl<'a> Plan<'a> {
    pub(super) fn new(groups: &[Group<'a>]) -> Self {
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
                    let runs = Run::of(
                        numbered
                            .iter()
                            .map(|&(limit, _, hit)| (limit, Cost(hit.hits))),
                    );
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

/// Consecutive hits of one limit: `len` of them at one `cost` (an `each` group of the
/// script), or, with no cost, each at its own (a `costs` group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Run {
    limit: usize,
    cost: Option<Cost>,
    len: usize,
}

/// The longest run of one cost that is pooled with its neighbours of the same limit. A run
/// of one cost sends a header of four arguments and then a key a hit, a pool three and then
/// a cost and a key a hit: two runs of one or two hits (a report's charges, each of its own
/// amount) cost less pooled, longer ones apart.
const POOLED_RUN: usize = 2;

impl Run {
    /// The runs of hits of the limits and costs `hits` names, in that order: runs of one
    /// limit and one cost, then short ones of one limit pooled.
    fn of(hits: impl Iterator<Item = (usize, Cost)>) -> Vec<Run> {
        let mut runs: Vec<Run> = Vec::new();
        for (limit, cost) in hits {
            match runs.last_mut() {
                Some(last) if last.limit == limit && last.cost == Some(cost) => last.len += 1,
                _ => runs.push(Run {
                    limit,
                    cost: Some(cost),
                    len: 1,
                }),
            }
        }
        let mut pooled: Vec<Run> = Vec::with_capacity(runs.len());
        for run in runs {
            match pooled.last_mut() {
                Some(last) if last.limit == run.limit && last.pools() && run.pools() => {
                    last.cost = None;
                    last.len += run.len;
                }
                _ => pooled.push(run),
            }
        }
        pooled
    }

    /// Whether the run goes in a pool with a neighbour: it is one, or short.
    fn pools(&self) -> bool {
        self.cost.is_none() || self.len <= POOLED_RUN
    }
}

/// The EVALSHA that decides every group, in order, in one script call that reads the clock
/// once (`lua/batch.lua`). `local_now` is this process's clock, used only to compute calendar
/// windows around now (the script picks the one that contains Redis' time). A call that
/// runs after `deadline` (µs on the script's clock) decides nothing: [`Answer::Late`](super::Answer::Late).
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
                let mut hits = hits.iter().map(|&(_, hit)| hit);
                for run in runs {
                    let these = hits.by_ref().take(run.len);
                    match run.cost {
                        Some(cost) => {
                            call.arg("each").arg(run.len).arg(run.limit).arg(cost);
                            these.for_each(|hit| {
                                call.arg(&hit.key);
                            });
                        }
                        None => {
                            call.arg("costs").arg(run.len).arg(run.limit);
                            these.for_each(|hit| {
                                call.arg(Cost(hit.hits)).arg(&hit.key);
                            });
                        }
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
pub(super) struct Cost(Hits);

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

/// A calendar-aligned fixed window's boundaries b0 < b1 < b2 < b3 around `local_now`: the
/// previous, the current and the next window. Redis' clock may differ from this process's
/// by a little; the script picks the window that contains its own now.
pub(super) fn calendar_boundaries(limit: &Limit, local_now: u64) -> Option<[u64; 4]> {
    let zone = match (&limit.timezone, limit.algorithm) {
        (Some(zone), Algorithm::FixedWindow) => zone,
        _ => return None,
    };
    let (start, end) = zone.window(limit.unit, local_now);
    let (previous, _) = zone.window(limit.unit, start.saturating_sub(1));
    let (_, next) = zone.window(limit.unit, end);
    Some([previous, start, end, next])
}
