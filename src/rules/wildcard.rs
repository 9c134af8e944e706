//! `*` glob patterns in descriptor values.
//!
//! envoyproxy/ratelimit started with a trailing `*` only (a prefix match); rule files now put
//! `*` anywhere (`/v1/*/orders`, `*.example.com`, `a*b*c`). Matching is linear in the value's
//! length: the pattern is split once into literal segments, and a value matches when the first
//! segment is its prefix, the last its suffix, and the middle ones occur in order in between.
//! Taking the leftmost occurrence of each middle segment is always right for `*`-only globs,
//! so nothing is ever retried and no input can make matching slow.

/// A descriptor value with one or more `*`, each matching any (possibly empty) run of
/// characters. A pattern without `*` matches only itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wildcard {
    pattern: String,
    /// The pattern's literal segments between `*`s; the first and last are anchored.
    segments: Vec<String>,
}

impl Wildcard {
    pub fn new(pattern: &str) -> Self {
        Wildcard {
            pattern: pattern.to_owned(),
            segments: pattern.split('*').map(str::to_owned).collect(),
        }
    }

    /// The pattern as written in the rule file.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    pub fn matches(&self, value: &str) -> bool {
        let (first, rest) = match self.segments.split_first() {
            Some(split) => split,
            None => return value.is_empty(),
        };
        let Some((last, middle)) = rest.split_last() else {
            return value == first;
        };
        if value.len() < first.len() + last.len()
            || !value.starts_with(first.as_str())
            || !value.ends_with(last.as_str())
        {
            return false;
        }
        let mut between = &value[first.len()..value.len() - last.len()];
        for segment in middle {
            match between.find(segment.as_str()) {
                Some(at) => between = &between[at + segment.len()..],
                None => return false,
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::Wildcard;

    #[test]
    fn trailing_star_matches_any_suffix_including_none() {
        let w = Wildcard::new("/v1/*");
        assert!(w.matches("/v1/"));
        assert!(w.matches("/v1/users/7"));
        assert!(!w.matches("/v2/users"));
        assert!(!w.matches("/v1"));
    }

    #[test]
    fn leading_star_matches_any_prefix() {
        let w = Wildcard::new("*.example.com");
        assert!(w.matches("api.example.com"));
        assert!(w.matches(".example.com"));
        assert!(!w.matches("example.com"));
    }

    #[test]
    fn middle_star_needs_both_ends() {
        let w = Wildcard::new("/v1/*/orders");
        assert!(w.matches("/v1/42/orders"));
        assert!(w.matches("/v1//orders"));
        assert!(w.matches("/v1/a/b/orders"));
        assert!(!w.matches("/v1/42/orders/7"));
        assert!(!w.matches("/v2/42/orders"));
    }

    #[test]
    fn prefix_and_suffix_may_not_overlap() {
        let w = Wildcard::new("ab*ba");
        assert!(!w.matches("aba"));
        assert!(w.matches("abba"));
    }

    #[test]
    fn multiple_stars_match_segments_in_order() {
        let w = Wildcard::new("a*b*c");
        assert!(w.matches("abc"));
        assert!(w.matches("a123b456c"));
        assert!(w.matches("abbbc"));
        assert!(!w.matches("acb"));
        assert!(!w.matches("a123c"));
    }

    #[test]
    fn consecutive_stars_act_as_one() {
        let w = Wildcard::new("a**c");
        assert!(w.matches("ac"));
        assert!(w.matches("abc"));
    }

    #[test]
    fn lone_star_matches_everything() {
        let w = Wildcard::new("*");
        assert!(w.matches(""));
        assert!(w.matches("anything at all"));
    }

    #[test]
    fn pattern_without_star_matches_only_itself() {
        let w = Wildcard::new("exact");
        assert!(w.matches("exact"));
        assert!(!w.matches("exactly"));
    }

    #[test]
    fn matching_is_byte_safe_with_multibyte_characters() {
        let w = Wildcard::new("é*ü");
        assert!(w.matches("éü"));
        assert!(w.matches("é—ü"));
        assert!(!w.matches("ü"));
    }

    #[test]
    fn adversarial_pattern_matches_quickly() {
        // Exponential under naive backtracking: many stars against a long value that almost
        // matches. Linear here, so this runs in microseconds.
        let pattern = format!("*{}b*", "a*".repeat(50));
        let value = "a".repeat(100_000);
        let started = std::time::Instant::now();
        assert!(!Wildcard::new(&pattern).matches(&value));
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }
}
