//! Rules: envoyproxy/ratelimit's YAML rule files, extended, loaded into a tree per domain
//! and matched against request descriptors.
//!
//! `load.rs` turns a directory of files into a [`RuleSet`] (or errors naming file, line and
//! rule): `yaml.rs` parses a file into a tree of nodes that know their line, `reader.rs`
//! reads typed fields from it, `descriptor.rs` and `limits.rs` build the descriptor tree and
//! its limits. `matcher.rs` finds the rule for one descriptor with envoyproxy/ratelimit's
//! semantics, `wildcard.rs` matches `*` values, `dump.rs` prints the rules for `/rlconfig`.
//! A `RuleSet` is immutable: a reload builds a new one and swaps it whole.

mod descriptor;
mod dump;
mod limits;
mod load;
mod matcher;
mod reader;
mod stats;
#[cfg(test)]
mod testing;
mod wildcard;
mod yaml;

use std::collections::BTreeMap;
use std::sync::Arc;

pub use load::{DEFAULT_RULES_MAX_BYTES, LoadError, LoadErrors, RuleFiles};
pub use matcher::Match;
pub use stats::{Judged, RuleStats, StatsSlot};
pub use wildcard::Wildcard;

use crate::limiter::Limit;
/// One (key, value) entry of a descriptor, as Envoy's requests carry it: the one type a
/// descriptor travels as in the library, from a request, an RLQS bucket or the admin API to
/// the matcher, the counters' keys and the rule statistics.
pub use crate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

impl Entry {
    pub fn new(key: impl Into<String>, value: impl Into<String>) -> Self {
        Entry {
            key: key.into(),
            value: value.into(),
        }
    }
}

/// What a rule does when its backend fails (`on_backend_error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnBackendError {
    /// Answer gRPC UNAVAILABLE; Envoy applies its `failure_mode_deny`.
    #[default]
    Error,
    /// Answer OK.
    FailOpen,
    /// Answer OVER_LIMIT.
    FailClosed,
    /// Decide with the in-process limiter until the backend is back.
    Local,
}

impl OnBackendError {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "error" => Some(Self::Error),
            "fail_open" => Some(Self::FailOpen),
            "fail_closed" => Some(Self::FailClosed),
            "local" => Some(Self::Local),
            _ => None,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Self::Error => "error",
            Self::FailOpen => "fail_open",
            Self::FailClosed => "fail_closed",
            Self::Local => "local",
        }
    }
}

/// What a matched rule imposes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Policy {
    /// `unlimited: true`: always OK, remaining 4294967295, nothing counted.
    Unlimited { name: Option<String> },
    /// One or more limits (`rate_limit` or `rate_limits`); all must pass.
    Limited(Vec<NamedLimit>),
}

/// One limit of a rule with its optional `name` (returned as `current_limit.name`, and what
/// `replaces` refers to).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedLimit {
    pub name: Option<String>,
    pub limit: Limit,
}

/// Where a rule was written, for error messages and `/rlconfig`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub file: String,
    pub line: usize,
}

/// The limit at one node of the descriptor tree, with the options that shape its answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Stable identity: the domain and the config path of keys and values, e.g.
    /// `api.user_id.path_/v1/*` (envoyproxy/ratelimit's stats key). Part of counter keys.
    pub id: String,
    pub policy: Policy,
    /// Names of rules this one replaces when both match one request.
    pub replaces: Vec<String>,
    /// Counted and reported, but never rejects.
    pub shadow_mode: bool,
    /// Over limit does not reject on its own; see the service's combine step.
    pub quota_mode: bool,
    /// Values matched by this node's wildcard share one counter instead of one per value.
    pub share_threshold: bool,
    /// Metrics label this rule with each request's values (all levels), not its path.
    pub detailed_metric: bool,
    /// Metrics label this level with the request's value (see [`MetricLevel`]).
    pub value_to_metric: bool,
    /// User metadata merged into `dynamic_metadata` when the descriptor is under its limit.
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
    /// `None`: the global default applies.
    pub on_backend_error: Option<OnBackendError>,
    pub source: Source,
    /// The levels of the path from the domain to this rule, as metrics label them.
    pub metric_levels: Vec<MetricLevel>,
    /// This rule's statistics, found in the metrics registry on its first hit so that later
    /// hits reach them without a lookup.
    pub stats: StatsSlot,
}

/// One level of a rule's path as metrics see it (envoyproxy/ratelimit's statistics key):
/// `key` or `key_value`, or with `value_to_metric` the key and the request's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricLevel {
    /// The level's part of the rule id: `key`, or `key_value` when the level has a value.
    pub segment: String,
    /// The level's `value_to_metric`: label it with the request's value instead.
    pub value_to_metric: bool,
    /// The level's `share_threshold`: its values share one counter, and one series under
    /// the pattern, whatever `value_to_metric` or `detailed_metric` say (as upstream).
    pub shared: bool,
}

/// One `descriptors:` entry: a key, an optional value (exact or wildcard), an optional rule
/// and nested descriptors.
#[derive(Debug, Clone)]
pub struct DescriptorNode {
    pub key: String,
    /// `None`: the key-only default, matching any value.
    pub value: Option<String>,
    pub rule: Option<Arc<Rule>>,
    pub children: Descriptors,
    /// `share_threshold` (wildcard values only): every value the wildcard matches is counted
    /// as the pattern itself, by this node's rule and by the rules below it.
    pub share_threshold: bool,
}

/// The descriptors of one level, indexed for envoyproxy/ratelimit's lookup order: exact
/// value, then the first matching wildcard in declaration order, then the key-only default.
#[derive(Debug, Clone, Default)]
pub struct Descriptors {
    /// Every node in declaration order (for `/rlconfig`).
    pub nodes: Vec<DescriptorNode>,
    /// (key, value) → index into `nodes`.
    pub exact: std::collections::HashMap<(String, String), usize, foldhash::fast::RandomState>,
    /// (key, pattern, index into `nodes`) in declaration order.
    pub wildcards: Vec<(String, Wildcard, usize)>,
    /// key → index into `nodes` of the key-only default.
    pub defaults: std::collections::HashMap<String, usize, foldhash::fast::RandomState>,
}

/// All rules of one domain.
#[derive(Debug, Clone)]
pub struct Domain {
    pub name: String,
    pub descriptors: Descriptors,
    pub source: Source,
}

/// Every loaded domain. Immutable once built.
#[derive(Debug, Clone, Default)]
pub struct RuleSet {
    /// Sorted by name, so `/rlconfig` is stable.
    pub domains: BTreeMap<String, Domain>,
    pub origin: Origin,
}

/// Where a rule set came from, for `/rlconfig` and `floodgate_rules_info`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Origin {
    /// The rule files of the rules directory.
    #[default]
    Files,
    /// A snapshot from an xDS server: the server and the snapshot's version.
    Xds { server: String, version: String },
    /// Nothing yet: serving before the first xDS snapshot arrived.
    AwaitingXds { server: String },
}

impl Origin {
    /// `files` or `xds`, the source the settings name.
    pub fn source(&self) -> &'static str {
        match self {
            Origin::Files => "files",
            Origin::Xds { .. } | Origin::AwaitingXds { .. } => "xds",
        }
    }
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Files => f.write_str("rule files"),
            Origin::Xds { server, version } => write!(f, "xds {server}, version {version:?}"),
            Origin::AwaitingXds { server } => write!(f, "xds {server}, no snapshot yet"),
        }
    }
}

impl Rule {
    /// Every name this rule answers to, for `replaces`.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        let (single, limits): (Option<&String>, &[NamedLimit]) = match &self.policy {
            Policy::Unlimited { name } => (name.as_ref(), &[]),
            Policy::Limited(limits) => (None, limits),
        };
        single
            .into_iter()
            .chain(limits.iter().filter_map(|l| l.name.as_ref()))
            .map(String::as_str)
    }
}

impl RuleSet {
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// The length in bytes of the longest domain a rule names (0 with none): how long a
    /// label of an unknown domain may be (`metrics::OTHER_DOMAINS`).
    pub fn longest_domain(&self) -> usize {
        self.domains.keys().map(String::len).max().unwrap_or(0)
    }

    /// A request these rules decide, for the start banner: the first rule in [`rules`]'
    /// order, as its domain and the entries of its path (a wildcard's `*` and a key-only
    /// level read `example`); `None` when no rule is loaded.
    ///
    /// [`rules`]: RuleSet::rules
    pub fn example(&self) -> Option<(&str, Vec<Entry>)> {
        fn first(level: &Descriptors, path: &mut Vec<Entry>) -> bool {
            for node in &level.nodes {
                let value = (node.value.as_deref())
                    .map_or("example".into(), |value| value.replace('*', "example"));
                path.push(Entry::new(node.key.clone(), value));
                if node.rule.is_some() || first(&node.children, path) {
                    return true;
                }
                path.pop();
            }
            false
        }
        self.domains.values().find_map(|domain| {
            let mut path = Vec::new();
            first(&domain.descriptors, &mut path).then_some((domain.name.as_str(), path))
        })
    }

    /// Every rule with its depth, in stable order: domains by name, descriptors in
    /// declaration order, depth first.
    pub fn rules(&self) -> impl Iterator<Item = &Arc<Rule>> {
        fn walk<'a>(level: &'a Descriptors, out: &mut Vec<&'a Arc<Rule>>) {
            for node in &level.nodes {
                if let Some(rule) = &node.rule {
                    out.push(rule);
                }
                walk(&node.children, out);
            }
        }
        let mut out = Vec::new();
        for domain in self.domains.values() {
            walk(&domain.descriptors, &mut out);
        }
        out.into_iter()
    }
}
