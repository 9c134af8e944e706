//! Helpers for the rules tests: rule files written inline, indented with the test code.

use super::{LoadErrors, RuleSet};

/// Removes the leading newline and the common indentation, so rule files can be written
/// indented in a test; line 1 is the first line after the opening quote.
pub fn dedent(text: &str) -> String {
    let text = text.strip_prefix('\n').unwrap_or(text);
    let indent = text
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| line.len() - line.trim_start().len())
        .min()
        .unwrap_or(0);
    text.lines()
        .map(|line| line.get(indent..).unwrap_or("").trim_end())
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// Loads one rule file named `rules.yaml`.
pub fn load(text: &str) -> Result<RuleSet, LoadErrors> {
    RuleSet::from_sources(&[("rules.yaml".to_owned(), dedent(text))])
}

/// Loads one rule file that must be valid.
pub fn load_ok(text: &str) -> RuleSet {
    load(text).unwrap_or_else(|e| panic!("expected the rules to load:\n{e}"))
}
