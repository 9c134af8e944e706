//! The loaded rules as text, for `GET /rlconfig`: where they came from, then one line per
//! rule, in the stable order of [`RuleSet::rules`], so two loads of the same files dump the
//! same text.

use std::fmt::Write;

use super::{NamedLimit, Policy, Rule, RuleSet};

impl RuleSet {
    /// One line per rule: `<id>: <limits or unlimited>, shadow_mode=…, quota_mode=…`, each
    /// limit with its unit, multiplier, requests per unit, algorithm, burst, time zone and
    /// name (`none` where not set).
    pub fn dump(&self) -> String {
        let mut out = format!("# rules from {}\n", self.origin);
        for rule in self.rules() {
            dump_rule(&mut out, rule);
        }
        out
    }
}

fn dump_rule(out: &mut String, rule: &Rule) {
    let _ = write!(out, "{}: ", rule.id);
    match &rule.policy {
        Policy::Unlimited { name } => {
            let _ = write!(
                out,
                "{{unlimited, name={}}}",
                name.as_deref().unwrap_or("none")
            );
        }
        Policy::Limited(limits) => {
            for (i, limit) in limits.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                dump_limit(out, limit);
            }
        }
    }
    let _ = writeln!(
        out,
        ", shadow_mode={}, quota_mode={}",
        rule.shadow_mode, rule.quota_mode
    );
}

fn dump_limit(out: &mut String, named: &NamedLimit) {
    let limit = &named.limit;
    let burst = limit
        .burst
        .map_or_else(|| "none".to_owned(), |b| b.to_string());
    // `overshoot` is shown only where set, so the lines of limits without it stay as before.
    let overshoot = if limit.overshoot {
        ", overshoot=true"
    } else {
        ""
    };
    let lease = if limit.lease { ", lease=true" } else { "" };
    let _ = write!(
        out,
        "{{unit={}, unit_multiplier={}, requests_per_unit={}, algorithm={}, burst={burst}, \
         timezone={}, name={}{overshoot}{lease}}}",
        limit.unit.name(),
        limit.unit_multiplier,
        limit.requests_per_unit,
        limit.algorithm.name(),
        limit.timezone.as_ref().map_or("none", |tz| tz.name()),
        named.name.as_deref().unwrap_or("none"),
    );
}
