//! The identity of one counter, encoded injectively.
//!
//! envoyproxy/ratelimit joins keys and values with `_`, so `("a_b", "c")` and `("a", "b_c")`
//! share a counter. Here every component is percent-escaped before it is joined, and every
//! separator is escaped inside components, so two different identities can never produce the
//! same bytes (a long descriptor part is replaced by its SHA-256, [`MAX_ENTRIES_TEXT`]). The
//! descriptor part is wrapped in `{…}`: Redis Cluster hashes only that part,
//! so all keys of one counter land in one slot, and since `{` and `}` are escaped inside it a
//! value can neither close the tag early nor open a second one.

use std::fmt::Write;

use super::Limit;

/// The longest descriptor part a key spells out. A longer one (a client's long values: up
/// to 16 entries of 1 KiB each, escaped) is replaced by `#` and the first `DIGEST_BYTES`
/// of its SHA-256 in hex, so that a counter's key, in memory and in Redis, is at most this
/// plus what the rules name: a million counters fit the Helm chart's memory limit whatever
/// clients send. The two forms never meet: a spelled-out part holds `=` (or is empty), a
/// digest never does.
pub const MAX_ENTRIES_TEXT: usize = 48;

/// How much of the digest a key keeps: 128 bits, so that two descriptors share a counter
/// only by a collision no client can search for (2^64 tries for any pair at all).
const DIGEST_BYTES: usize = 16;

/// One counter's identity: (domain, rule, limit index, descriptor entries) inside the hash
/// tag, then the algorithm and the window shape. The limit's `requests_per_unit` is not part
/// of it, so a reload that only changes the number keeps the count.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CounterKey(Box<str>);

impl CounterKey {
    /// The key of each of rule `rule_id`'s `limits`, in order, for the descriptor `entries`
    /// it matched: the one place a match becomes counters, whoever asks (ShouldRateLimit,
    /// an RLQS report, the admin API), so that all of them count on the same keys.
    pub fn of_rule<'l>(
        domain: &'l str,
        rule_id: &'l str,
        limits: impl IntoIterator<Item = &'l Limit> + 'l,
        entries: &'l [(&'l str, &'l str)],
    ) -> impl Iterator<Item = CounterKey> + 'l {
        (limits.into_iter().enumerate()).map(move |(index, limit)| {
            CounterKey::new(domain, rule_id, index, limit, entries.iter().copied())
        })
    }

    /// Builds the key of the `limit_index`-th limit of rule `rule_id` in `domain`, for the
    /// descriptor `entries` (key, value) as the rule counts them.
    pub fn new<'a>(
        domain: &str,
        rule_id: &str,
        limit_index: usize,
        limit: &Limit,
        entries: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Self {
        let mut key = String::with_capacity(64);
        key.push('{');
        escape_into(&mut key, domain);
        key.push(':');
        escape_into(&mut key, rule_id);
        key.push(':');
        key.push_str(itoa::Buffer::new().format(limit_index));
        key.push(':');
        let start = key.len();
        for (i, (name, value)) in entries.into_iter().enumerate() {
            if i > 0 {
                key.push(';');
            }
            escape_into(&mut key, name);
            key.push('=');
            escape_into(&mut key, value);
        }
        if key.len() - start > MAX_ENTRIES_TEXT {
            let digest = ring::digest::digest(&ring::digest::SHA256, &key.as_bytes()[start..]);
            key.truncate(start);
            key.push('#');
            for byte in &digest.as_ref()[..DIGEST_BYTES] {
                let _ = write!(key, "{byte:02x}");
            }
        }
        key.push_str("}:");
        key.push_str(limit.algorithm.name());
        key.push(':');
        key.push_str(itoa::Buffer::new().format(limit.window_micros() / super::SECOND_MICROS));
        if let Some(zone) = &limit.timezone {
            key.push(':');
            escape_into(&mut key, zone.name());
        }
        CounterKey(key.into_boxed_str())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The part Redis Cluster hashes: the text between the first `{` and the next `}`.
    pub fn hash_tag(&self) -> &str {
        let end = self.0.find('}').unwrap_or(self.0.len());
        &self.0[1..end]
    }
}

impl std::fmt::Display for CounterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Percent-escapes the separators, `%` itself, and anything that is not printable ASCII.
fn escape_into(out: &mut String, component: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut plain = 0;
    for (at, byte) in component.bytes().enumerate() {
        if matches!(byte, b'%' | b'{' | b'}' | b':' | b';' | b'=' | 0..=0x20 | 0x7f..=0xff) {
            // The bytes since the last escape are printable ASCII: `plain` and `at` are
            // character boundaries.
            if at > plain {
                out.push_str(&component[plain..at]);
            }
            out.push('%');
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0xf)]));
            plain = at + 1;
        }
    }
    if plain < component.len() {
        out.push_str(&component[plain..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Algorithm, Unit};

    fn key(domain: &str, rule: &str, entries: &[(&str, &str)]) -> CounterKey {
        CounterKey::new(
            domain,
            rule,
            0,
            &Limit::per(10, Unit::Second),
            entries.iter().copied(),
        )
    }

    #[test]
    fn a_rules_keys_are_its_limits_in_order() {
        let limits = [Limit::per(10, Unit::Second), Limit::per(100, Unit::Hour)];
        let entries = [("user", "alice")];
        let keys: Vec<CounterKey> = CounterKey::of_rule("d", "r", &limits, &entries).collect();
        let expected: Vec<CounterKey> = (limits.iter().enumerate())
            .map(|(index, limit)| CounterKey::new("d", "r", index, limit, entries))
            .collect();
        assert_eq!(keys, expected);
        assert_ne!(keys[0], keys[1], "each limit counts on a key of its own");
    }

    #[test]
    fn underscore_joins_do_not_collide() {
        assert_ne!(
            key("d", "r", &[("a_b", "c")]),
            key("d", "r", &[("a", "b_c")])
        );
    }

    #[test]
    fn separators_inside_values_do_not_collide() {
        let tricky = [
            key("d", "r", &[("a", "b;c=d")]),
            key("d", "r", &[("a", "b"), ("c", "d")]),
            key("d:r", "", &[]),
            key("d", ":r", &[]),
            key("d", "r", &[("a=b", "")]),
            key("d", "r", &[("a", "=b")]),
            key("d", "r", &[("a", "%3D")]),
            key("d", "r", &[("a", "=")]),
        ];
        for (i, a) in tricky.iter().enumerate() {
            for b in &tricky[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    #[test]
    fn braces_in_values_cannot_forge_or_split_the_hash_tag() {
        let forged = key("d", "r", &[("k", "}{evil}")]);
        assert_eq!(forged.hash_tag(), "d:r:0:k=%7D%7Bevil%7D");
        assert_eq!(forged.as_str().matches('{').count(), 1);
    }

    #[test]
    fn algorithm_and_window_are_part_of_the_identity_but_the_rate_is_not() {
        let base = Limit::per(10, Unit::Minute);
        let make = |limit: &Limit| CounterKey::new("d", "r", 0, limit, [("k", "v")]);
        let mut other_rate = base.clone();
        other_rate.requests_per_unit = 99;
        let mut other_algorithm = base.clone();
        other_algorithm.algorithm = Algorithm::Gcra;
        let mut other_window = base.clone();
        other_window.unit_multiplier = 5;
        assert_eq!(make(&base), make(&other_rate));
        assert_ne!(make(&base), make(&other_algorithm));
        assert_ne!(make(&base), make(&other_window));
        assert_eq!(make(&base).hash_tag(), make(&other_window).hash_tag());
    }

    #[test]
    fn a_long_descriptor_part_becomes_its_digest_and_stays_apart() {
        let long = "v".repeat(1024);
        let other = format!("{}w", "v".repeat(1023));
        let hashed = key("d", "r", &[("user", &long)]);
        assert!(hashed.as_str().len() < 4 + 1 + 32 + 32, "{hashed}");
        assert!(!hashed.hash_tag().contains('='), "{hashed}");
        assert_ne!(hashed, key("d", "r", &[("user", &other)]));
        assert_ne!(hashed, key("d", "r", &[("user", &long), ("x", "")]));
        // The longest part spelled out stays as it is.
        let spelled = "v".repeat(MAX_ENTRIES_TEXT - "user=".len());
        assert!(
            key("d", "r", &[("user", &spelled)])
                .hash_tag()
                .ends_with(&spelled)
        );
    }
}
