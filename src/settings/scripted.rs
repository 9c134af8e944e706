//! The section of the unit tests' store (`backend: scripted`, `backend/scripted.rs`): what a
//! new store's settings look like, one struct read from the same layers as every other.

use serde::Deserialize;

/// `scripted.*`: how the test store behaves.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScriptedSettings {
    /// Every call fails, as a store that is down.
    pub down: bool,
}
