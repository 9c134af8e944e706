//! STUB — to be replaced: loads rule files into a RuleSet.
use std::path::Path;

use super::RuleSet;

/// One problem in a rule file: where it is and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {rule}: {message}")]
pub struct LoadError {
    pub file: String,
    pub line: usize,
    /// The rule's path, e.g. `domain api > user_id > path=/v1/*`.
    pub rule: String,
    pub message: String,
}

/// Every problem found while loading; a load with any error keeps nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadErrors(pub Vec<LoadError>);

impl std::fmt::Display for LoadErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for LoadErrors {}

impl RuleSet {
    /// Loads every `*.yaml` / `*.yml` file of `dir` (not recursive, hidden files skipped).
    pub fn load_dir(_dir: &Path) -> Result<RuleSet, LoadErrors> {
        todo!()
    }

    /// Loads rule files given as (file name, contents).
    pub fn from_sources(_sources: &[(String, String)]) -> Result<RuleSet, LoadErrors> {
        todo!()
    }

    /// The loaded rules as text, in stable order, for `GET /rlconfig`.
    pub fn dump(&self) -> String {
        todo!()
    }
}
