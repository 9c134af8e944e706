//! Finds the rule for one descriptor, with envoyproxy/ratelimit's semantics (its `GetLimit`).
//!
//! Per request entry, at the current level of the tree: the exact (key, value) node, else the
//! first wildcard node of that key whose pattern matches, in declaration order, else the
//! key-only default of that key, else nothing matches. The node picked for the last entry
//! must hold a rule: a rule higher up does not match a longer descriptor, and a descriptor
//! ending above the rules matches nothing. A level's choice is final: when a deeper entry
//! finds nothing, no other candidate of a level above is tried.
//!
//! Lookups do not allocate: the exact map is probed with borrowed strings (see
//! [`KeyValue`]) and everything else was indexed at load time; the only allocation is the
//! returned [`Match::entries`].

#[cfg(test)]
mod tests;

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use super::{DescriptorNode, Descriptors, Domain, Entry, Rule};

/// The rule a descriptor matched, and the (key, value) pairs its counter is keyed by: the
/// descriptor's values, or the wildcard pattern where the node has `share_threshold`.
#[derive(Debug, Clone)]
pub struct Match<'a> {
    pub rule: &'a Arc<Rule>,
    pub entries: Vec<(&'a str, &'a str)>,
}

impl Domain {
    /// envoyproxy/ratelimit's lookup: per entry, exact value, then the first matching
    /// wildcard in declaration order, then the key-only default; the rule must sit at exactly
    /// the descriptor's depth; no backtracking. `None`: no limit applies.
    pub fn find<'a, I>(&'a self, entries: I) -> Option<Match<'a>>
    where
        I: IntoIterator<Item = &'a Entry>,
    {
        let entries = entries.into_iter();
        let mut counted = Vec::with_capacity(entries.size_hint().0);
        let mut level = &self.descriptors;
        let mut reached: Option<&'a DescriptorNode> = None;
        for Entry { key, value } in entries {
            let node = level.lookup(key, value)?;
            let counted_value = match (&node.value, node.share_threshold) {
                (Some(pattern), true) => pattern.as_str(),
                _ => value.as_str(),
            };
            counted.push((key.as_str(), counted_value));
            level = &node.children;
            reached = Some(node);
        }
        let rule = reached?.rule.as_ref()?;
        Some(Match {
            rule,
            entries: counted,
        })
    }
}

/// The lookups [`Domain::order_matching`] may make for one set of entries: enough for any
/// tree a rule file holds, and a bound on what an unmatched bucket costs whatever the tree.
const LOOKUPS_PER_ORDER_SEARCH: usize = 4_096;

impl Domain {
    /// An order of `entries` (which have none of their own: an RLQS bucket's) in which
    /// [`Domain::find`] reaches a rule, as indexes into `entries`; `None` when no order does.
    /// Orders are tried in their lexicographic order (the given one first), walking the
    /// tree: an entry no node of a level takes is not tried there again, so a bucket that
    /// matches nothing costs one lookup per entry at the first level, not one per order.
    pub fn order_matching(&self, entries: &[Entry]) -> Option<Vec<usize>> {
        let mut search = OrderSearch {
            entries,
            used: vec![false; entries.len()],
            order: Vec::with_capacity(entries.len()),
            lookups_left: LOOKUPS_PER_ORDER_SEARCH,
        };
        (!entries.is_empty() && search.from(&self.descriptors)).then_some(search.order)
    }
}

/// A depth-first search for an order of entries that leads to a rule.
struct OrderSearch<'e> {
    entries: &'e [Entry],
    used: Vec<bool>,
    order: Vec<usize>,
    lookups_left: usize,
}

impl OrderSearch<'_> {
    /// Whether the unused entries, in some order, lead from `level` to a rule (then `order`
    /// holds the whole path).
    fn from(&mut self, level: &Descriptors) -> bool {
        for index in 0..self.entries.len() {
            if self.used[index] {
                continue;
            }
            if self.lookups_left == 0 {
                return false;
            }
            self.lookups_left -= 1;
            let Entry { key, value } = &self.entries[index];
            let Some(node) = level.lookup(key, value) else {
                continue;
            };
            self.used[index] = true;
            self.order.push(index);
            let found = if self.order.len() == self.entries.len() {
                node.rule.is_some()
            } else {
                self.from(&node.children)
            };
            if found {
                return true;
            }
            self.used[index] = false;
            self.order.pop();
        }
        false
    }
}

impl Descriptors {
    /// The node one request entry selects at this level, if any.
    fn lookup(&self, key: &str, value: &str) -> Option<&DescriptorNode> {
        let index = self
            .exact
            .get(&(key, value) as &dyn KeyValue)
            .or_else(|| {
                self.wildcards
                    .iter()
                    .find(|(k, pattern, _)| k == key && pattern.matches(value))
                    .map(|(_, _, index)| index)
            })
            .or_else(|| self.defaults.get(key))?;
        self.nodes.get(*index)
    }
}

/// A (key, value) pair, owned or borrowed, so the `(String, String)` keys of
/// [`Descriptors::exact`] can be probed with two `&str` without building Strings.
///
/// This is the standard trick for composite borrowed keys: the map's key type borrows as
/// `dyn KeyValue`, and a `(&str, &str)` is one too. Hash and equality of `dyn KeyValue` are
/// those of the `(String, String)` tuple (key, then value, each hashed as a `str`), as
/// `Borrow` requires.
pub trait KeyValue {
    fn key(&self) -> &str;
    fn value(&self) -> &str;
}

impl KeyValue for (String, String) {
    fn key(&self) -> &str {
        &self.0
    }

    fn value(&self) -> &str {
        &self.1
    }
}

impl KeyValue for (&str, &str) {
    fn key(&self) -> &str {
        self.0
    }

    fn value(&self) -> &str {
        self.1
    }
}

impl<'a> Borrow<dyn KeyValue + 'a> for (String, String) {
    fn borrow(&self) -> &(dyn KeyValue + 'a) {
        self
    }
}

impl Hash for dyn KeyValue + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state);
        self.value().hash(state);
    }
}

impl PartialEq for dyn KeyValue + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key() && self.value() == other.value()
    }
}

impl Eq for dyn KeyValue + '_ {}
