//! STUB — to be replaced: `*` glob patterns in descriptor values.

/// A descriptor value with one or more `*`, each matching any run of characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wildcard {
    pattern: String,
}

impl Wildcard {
    pub fn new(pattern: &str) -> Self {
        Wildcard {
            pattern: pattern.to_owned(),
        }
    }

    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    pub fn matches(&self, _value: &str) -> bool {
        todo!()
    }
}
