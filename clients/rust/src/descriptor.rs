//! What a request is counted by: a list of key/value entries that selects a rule.

use crate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use crate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

/// One rate-limit descriptor: ordered `(key, value)` entries, matched against the rules'
/// nested descriptors level by level, so the order of entries matters.
///
/// ```
/// use floodgate_client::Descriptor;
///
/// let built = Descriptor::new().entry("user_id", "alice").entry("path", "/orders");
/// let from_pairs = Descriptor::from_iter([("user_id", "alice"), ("path", "/orders")]);
/// assert_eq!(built, from_pairs);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Descriptor {
    entries: Vec<(String, String)>,
    hits: Option<u64>,
}

impl Descriptor {
    /// A descriptor with no entries yet; add them with [`entry`](Self::entry).
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends one entry (`key`, `value`).
    pub fn entry(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.entries.push((key.into(), value.into()));
        self
    }

    /// What this descriptor alone costs, in place of the call's `hits`. `0` only checks the
    /// limit without counting.
    pub fn hits(mut self, hits: u64) -> Self {
        self.hits = Some(hits);
        self
    }

    pub(crate) fn to_wire(&self) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: self
                .entries
                .iter()
                .map(|(key, value)| Entry {
                    key: key.clone(),
                    value: value.clone(),
                })
                .collect(),
            hits_addend: self.hits,
            ..RateLimitDescriptor::default()
        }
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Descriptor {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(pairs: I) -> Self {
        pairs
            .into_iter()
            .fold(Descriptor::new(), |descriptor, (key, value)| {
                descriptor.entry(key, value)
            })
    }
}
