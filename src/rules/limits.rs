//! A descriptor's `rate_limit` (one map) or `rate_limits` (floodgate: a list of maps) read
//! into a [`Policy`] and the names the rule `replaces`.

use saphyr::MarkedYaml;

use super::reader::{Fields, Reader};
use super::yaml;
use super::{NamedLimit, Policy};
use crate::limiter::{Algorithm, Limit, MAX_SPAN_MICROS, Timezone, Unit};

/// The keys of a `rate_limit` map, ordered so that the other key sets are its prefixes.
const RATE_LIMIT_KEYS: [&str; 11] = [
    // The keys that shape counting; none of them goes with `unlimited: true`.
    "unit",
    "requests_per_unit",
    "algorithm",
    "burst",
    "unit_multiplier",
    "timezone",
    "overshoot",
    "lease",
    // The rest of a `rate_limits` element's keys.
    "name",
    "replaces",
    // Only in a `rate_limit` map.
    "unlimited",
];

/// The keys that shape counting.
const COUNTING_KEYS: &[&str] = RATE_LIMIT_KEYS.split_at(8).0;

/// The keys of a `rate_limits` element: a `rate_limit` map's, without `unlimited`.
const LIST_ELEMENT_KEYS: &[&str] = RATE_LIMIT_KEYS.split_at(10).0;

const UNITS: &str = "second, minute, hour, day, week, month, year";

/// The limits a descriptor configures, if any.
pub(super) enum Configured {
    /// Neither `rate_limit` nor `rate_limits`.
    Absent,
    /// Written, but wrong; the errors are in the reader.
    Invalid,
    Present {
        policy: Policy,
        replaces: Vec<String>,
    },
}

/// One `rate_limit` map or `rate_limits` element.
struct ReadLimit {
    /// `None`: `unlimited: true`.
    limit: Option<Limit>,
    name: Option<String>,
    /// Each name with the line it was written on.
    replaces: Vec<(String, usize)>,
}

/// Reads the descriptor's `rate_limit` / `rate_limits` (given as the key's line and value).
pub(super) fn read(
    reader: &mut Reader<'_, '_>,
    rate_limit: Option<(usize, &MarkedYaml<'_>)>,
    rate_limits: Option<(usize, &MarkedYaml<'_>)>,
    rule: &str,
) -> Configured {
    let read = match (rate_limit, rate_limits) {
        (None, None) => return Configured::Absent,
        (Some(_), Some((line, _))) => {
            let message = "write either rate_limit (one limit) or rate_limits (a list), not both";
            reader.error(line, rule, message);
            return Configured::Invalid;
        }
        (Some((_, node)), None) => {
            read_one(reader, node, "rate_limit", true, rule).map(|one| vec![one])
        }
        (None, Some((line, node))) => read_list(reader, line, node, rule),
    };
    let Some(read) = read else {
        return Configured::Invalid;
    };
    combine(reader, read, rule)
}

fn read_list(
    reader: &mut Reader<'_, '_>,
    line: usize,
    node: &MarkedYaml<'_>,
    rule: &str,
) -> Option<Vec<ReadLimit>> {
    let items = reader.list(node, "rate_limits", rule)?;
    if items.is_empty() {
        let message = "rate_limits: expected at least one limit (remove the key for no limit)";
        reader.error(line, rule, message);
        return None;
    }
    let read: Vec<_> = items
        .iter()
        .enumerate()
        .map(|(i, item)| read_one(reader, item, &format!("rate_limits[{i}]"), false, rule))
        .collect();
    read.into_iter().collect()
}

/// Checks what only the whole rule can tell, and builds its policy.
fn combine(reader: &mut Reader<'_, '_>, read: Vec<ReadLimit>, rule: &str) -> Configured {
    let own: Vec<&str> = read.iter().filter_map(|r| r.name.as_deref()).collect();
    let mut valid = true;
    let mut replaces: Vec<String> = Vec::new();
    for (name, line) in read.iter().flat_map(|r| &r.replaces) {
        if own.contains(&name.as_str()) {
            let message = format!("replaces `{name}`, the name of this rule's own limit");
            reader.error(*line, rule, message);
            valid = false;
        } else if !replaces.contains(name) {
            replaces.push(name.clone());
        }
    }
    if !valid {
        return Configured::Invalid;
    }
    let policy = match read.as_slice() {
        [
            ReadLimit {
                limit: None, name, ..
            },
        ] => Policy::Unlimited { name: name.clone() },
        _ => Policy::Limited(
            read.into_iter()
                .filter_map(|r| {
                    Some(NamedLimit {
                        name: r.name,
                        limit: r.limit?,
                    })
                })
                .collect(),
        ),
    };
    Configured::Present { policy, replaces }
}

fn read_one(
    reader: &mut Reader<'_, '_>,
    node: &MarkedYaml<'_>,
    label: &str,
    allow_unlimited: bool,
    rule: &str,
) -> Option<ReadLimit> {
    let keys: &[&str] = if allow_unlimited {
        &RATE_LIMIT_KEYS
    } else {
        LIST_ELEMENT_KEYS
    };
    let errors_before = reader.errors.len();
    let fields = reader.fields(node, label, keys, rule)?;
    let field = |name: &str| format!("{label}.{name}");

    let name = fields
        .get("name")
        .and_then(|n| reader.string(n, &field("name"), rule))
        .filter(|n| !n.is_empty());
    let replaces = match fields.get("replaces") {
        Some(node) => read_replaces(reader, node, &field("replaces"), rule),
        None => Vec::new(),
    };
    let unlimited = fields
        .get("unlimited")
        .and_then(|n| reader.boolean(n, &field("unlimited"), rule))
        .unwrap_or(false);
    let limit = if unlimited {
        reject_counting_keys(reader, &fields, label, rule);
        None
    } else {
        read_limit(reader, &fields, label, rule)
    };
    (reader.errors.len() == errors_before).then_some(ReadLimit {
        limit,
        name,
        replaces,
    })
}

/// `unlimited: true` counts nothing, so every counting parameter is a mistake.
fn reject_counting_keys(
    reader: &mut Reader<'_, '_>,
    fields: &Fields<'_, '_>,
    label: &str,
    rule: &str,
) {
    for key in COUNTING_KEYS {
        if let Some((line, _)) = fields.entry(key) {
            let message = format!(
                "{label}: `{key}` cannot be combined with `unlimited: true`, which counts nothing"
            );
            reader.error(line, rule, message);
        }
    }
}

fn read_limit(
    reader: &mut Reader<'_, '_>,
    fields: &Fields<'_, '_>,
    label: &str,
    rule: &str,
) -> Option<Limit> {
    let field = |name: &str| format!("{label}.{name}");
    let unit = read_unit(reader, fields, label, rule);
    let requests_per_unit = match fields.get("requests_per_unit") {
        None => {
            let message = format!("{label}: missing `requests_per_unit` (0 blocks every request)");
            reader.error(fields.line, rule, message);
            None
        }
        Some(node) => reader.integer(node, &field("requests_per_unit"), 0, rule),
    };
    let algorithm = read_algorithm(reader, fields, label, rule);
    let unit_multiplier = match fields.get("unit_multiplier") {
        None => Some(1),
        Some(node) => reader.integer(node, &field("unit_multiplier"), 1, rule),
    };
    let burst = fields.get("burst").map(|node| {
        (
            yaml::line(node),
            reader.integer(node, &field("burst"), 1, rule),
        )
    });
    let timezone = fields.get("timezone").map(|node| {
        (
            yaml::line(node),
            reader.string(node, &field("timezone"), rule),
        )
    });

    let burst = burst.map(|(line, burst)| {
        let algorithm_fits = burst_fits(algorithm).map_err(|message| {
            reader.error(line, rule, format!("{}: {message}", field("burst")));
        });
        algorithm_fits.ok().and(burst)
    });
    let timezone = timezone.map(|(line, name)| {
        let parsed = timezone_fits(unit, unit_multiplier, algorithm)
            .and_then(|()| name.map_or(Ok(None), |name| Timezone::parse(&name).map(Some)));
        (parsed.map_err(|message| {
            reader.error(line, rule, format!("{}: {message}", field("timezone")));
        }))
        .ok()
        .flatten()
    });
    let overshoot = match fields.get("overshoot") {
        None => Some(false),
        Some(node) => reader.boolean(node, &field("overshoot"), rule),
    };
    let lease = match fields.get("lease") {
        None => Some(false),
        Some(node) => {
            let lease = reader.boolean(node, &field("lease"), rule);
            let fits = match lease {
                Some(true) => lease_fits(algorithm, overshoot),
                _ => Ok(()),
            };
            if let Err(message) = fits {
                reader.error(
                    yaml::line(node),
                    rule,
                    format!("{}: {message}", field("lease")),
                );
            }
            lease
        }
    };
    let limit = Limit {
        requests_per_unit: requests_per_unit?,
        unit: unit?,
        unit_multiplier: unit_multiplier?,
        algorithm: algorithm?,
        burst: optional(burst)?,
        timezone: optional(timezone)?,
        overshoot: overshoot?,
        lease: lease?,
    };
    if limit.span_micros() > MAX_SPAN_MICROS {
        let message = format!(
            "{label}: the window (or, for a bucket, the time to refill `burst` tokens) is longer \
             than 100 years"
        );
        reader.error(fields.line, rule, message);
        return None;
    }
    Some(limit)
}

/// Whether a limit of `algorithm` (when it was read) can lease its quota. A block is hits
/// taken out of the shared count ahead of the requests that spend them: a fixed window's
/// count and a token bucket's tokens are the same whenever they are spent within the block's
/// window (or, for tokens, its time to live). Not the others:
///
/// - `sliding_log` logs each hit at the instant it is counted: a block's hits would leave the
///   log a block's age before the requests that spent them, and the next window could admit
///   them again;
/// - `sliding_window` weighs the previous window's count by time, so the quota a block may
///   take changes while it is held, and a block must end with its window to stay exact;
/// - `gcra` is a token bucket counted as one theoretical arrival time: a block is the same as
///   a token bucket's, so the rule is better written as `token_bucket` with the same burst.
///
/// `overshoot` charges usage after the fact, past the limit: there is nothing for a block to
/// take ahead.
fn lease_fits(algorithm: Option<Algorithm>, overshoot: Option<bool>) -> Result<(), String> {
    if overshoot == Some(true) {
        return Err(
            "lease cannot be combined with overshoot, which charges usage after the \
                    fact instead of taking quota ahead"
                .to_owned(),
        );
    }
    match algorithm {
        Some(Algorithm::FixedWindow | Algorithm::TokenBucket) | None => Ok(()),
        Some(Algorithm::SlidingLog) => Err("sliding_log cannot lease: a block's hits would be \
             logged when the block is taken, not when its requests come, and leave the log \
             early; use fixed_window or token_bucket"
            .to_owned()),
        Some(Algorithm::SlidingWindow) => Err("sliding_window does not lease: the quota it \
             allows moves with the previous window's weight while a block is held; use \
             fixed_window or token_bucket"
            .to_owned()),
        Some(other) => Err(format!(
            "{} does not lease; token_bucket with the same burst counts the same and leases",
            other.name()
        )),
    }
}

/// Whether `burst` applies to `algorithm` (when it was read): token bucket and GCRA only.
fn burst_fits(algorithm: Option<Algorithm>) -> Result<(), String> {
    match algorithm {
        Some(Algorithm::TokenBucket | Algorithm::Gcra) | None => Ok(()),
        Some(other) => Err(format!(
            "burst applies to token_bucket and gcra only, not {}",
            other.name()
        )),
    }
}

/// Whether a `timezone` fits the limit's window (when its parts were read).
fn timezone_fits(
    unit: Option<Unit>,
    multiplier: Option<u32>,
    algorithm: Option<Algorithm>,
) -> Result<(), String> {
    match (unit, multiplier, algorithm) {
        (Some(unit), Some(multiplier), Some(algorithm)) => {
            timezone_problem(unit, multiplier, algorithm).map_or(Ok(()), Err)
        }
        _ => Ok(()),
    }
}

/// A limit's `unit`, which it must have; `None` after saying why it has none.
fn read_unit(
    reader: &mut Reader<'_, '_>,
    fields: &Fields<'_, '_>,
    label: &str,
    rule: &str,
) -> Option<Unit> {
    let Some(node) = fields.get("unit") else {
        let message = format!("{label}: missing `unit` (one of {UNITS})");
        reader.error(fields.line, rule, message);
        return None;
    };
    let name = reader.string(node, &format!("{label}.unit"), rule)?;
    let unit = Unit::parse(&name);
    if unit.is_none() {
        let message = format!("{label}.unit: unknown unit `{name}`; valid units: {UNITS}");
        reader.error(yaml::line(node), rule, message);
    }
    unit
}

/// A limit's `algorithm` (the default when it names none); `None` after saying why it is
/// not one.
fn read_algorithm(
    reader: &mut Reader<'_, '_>,
    fields: &Fields<'_, '_>,
    label: &str,
    rule: &str,
) -> Option<Algorithm> {
    let Some(node) = fields.get("algorithm") else {
        return Some(Algorithm::default());
    };
    let name = reader.string(node, &format!("{label}.algorithm"), rule)?;
    let algorithm = Algorithm::parse(&name);
    if algorithm.is_none() {
        let valid: Vec<_> = Algorithm::ALL.iter().map(|a| a.name()).collect();
        let message = format!(
            "{label}.algorithm: unknown algorithm `{name}`; valid algorithms: {}",
            valid.join(", ")
        );
        reader.error(yaml::line(node), rule, message);
    }
    algorithm
}

/// An optional field as read: `Some(None)` when not written, `None` when written but invalid.
fn optional<T>(read: Option<Option<T>>) -> Option<Option<T>> {
    match read {
        None => Some(None),
        Some(value) => value.map(Some),
    }
}

/// Why a time zone cannot apply: calendar windows exist for fixed windows of one day, week,
/// month or year.
fn timezone_problem(unit: Unit, unit_multiplier: u32, algorithm: Algorithm) -> Option<String> {
    if algorithm != Algorithm::FixedWindow {
        return Some(format!(
            "applies to fixed_window only, not {}",
            algorithm.name()
        ));
    }
    if !matches!(unit, Unit::Day | Unit::Week | Unit::Month | Unit::Year) {
        return Some(format!(
            "applies to unit day, week, month or year, not {}",
            unit.name()
        ));
    }
    if unit_multiplier != 1 {
        return Some(format!(
            "applies to unit_multiplier 1 only, not {unit_multiplier}"
        ));
    }
    None
}

/// `replaces: [{name: a}, {name: b}]`, each name with its line.
fn read_replaces(
    reader: &mut Reader<'_, '_>,
    node: &MarkedYaml<'_>,
    field: &str,
    rule: &str,
) -> Vec<(String, usize)> {
    let Some(items) = reader.list(node, field, rule) else {
        return Vec::new();
    };
    let mut names = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let entry = format!("{field}[{i}]");
        let Some(fields) = reader.fields(item, &entry, &["name"], rule) else {
            continue;
        };
        let name = match fields.get("name") {
            Some(name) => reader.string(name, &format!("{entry}.name"), rule),
            None => Some(String::new()),
        };
        match name {
            Some(name) if name.is_empty() => {
                let message = format!(
                    "{entry}: empty name; write `- name: <the name of the limit to replace>`"
                );
                reader.error(yaml::line(item), rule, message);
            }
            Some(name) => names.push((name, yaml::line(item))),
            None => {}
        }
    }
    names
}
