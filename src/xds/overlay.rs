//! floodgate's extensions for rules that arrive over xDS. envoyproxy/ratelimit's
//! `RateLimitConfig` carries a unit, a count and a name; an overlay adds, to the descriptor a
//! domain and path name, what a rule file would say of it: `algorithm`, `burst`,
//! `unit_multiplier`, `timezone` (on its limit) and `on_backend_error`. Overlays come from
//! a TOML file of the operator's (`xds.overlays_file`):
//!
//! ```toml
//! [[overlay]]
//! domain = "api"
//! path = ["user_id"]             # from the domain: `key`, or `key=value`, per level
//! algorithm = "token_bucket"
//! burst = 20
//! on_backend_error = "local"
//! ```
//!
//! They are merged into each snapshot before it is loaded, so the loader checks the result
//! like any rule file (a `burst` on a fixed window is an error, and the snapshot is NACKed).
//! An overlay that names no descriptor of the snapshot, or one without a limit, changes
//! nothing and is reported, since the server may simply not have sent that rule yet.

use std::path::Path;

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::files::{self, FileError};

/// The overlays of one file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Overlays {
    #[serde(default, rename = "overlay")]
    pub entries: Vec<Overlay>,
}

/// What to add to one descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Overlay {
    pub domain: String,
    /// The descriptor's entries from the domain down: `key`, or `key=value`.
    pub path: Vec<String>,
    pub algorithm: Option<String>,
    pub burst: Option<u64>,
    pub unit_multiplier: Option<u64>,
    pub timezone: Option<String>,
    pub on_backend_error: Option<String>,
}

impl Overlays {
    /// The overlays of the TOML file at `path`, read as [`crate::files`] reads every file
    /// (a regular file of at most `max_bytes`); an error names the file and what is wrong.
    pub fn read(path: &Path, max_bytes: u64) -> Result<Overlays, String> {
        Overlays::parse(path, files::read(path, max_bytes))
    }

    /// [`Overlays::read`], the file read on tokio's blocking pool.
    pub async fn read_off_runtime(path: &Path, max_bytes: u64) -> Result<Overlays, String> {
        Overlays::parse(
            path,
            files::read_off_runtime(path.to_owned(), max_bytes).await,
        )
    }

    fn parse(path: &Path, read: Result<Vec<u8>, FileError>) -> Result<Overlays, String> {
        let bytes = read.map_err(|error| error.to_string())?;
        let text = std::str::from_utf8(&bytes)
            .map_err(|error| format!("{}: not UTF-8: {error}", path.display()))?;
        toml::from_str(text).map_err(|error| format!("{}: {error}", path.display()))
    }

    /// Adds the overlays of `domain` to `descriptors` (a rule file's `descriptors` list);
    /// what could not be applied, each saying why.
    pub fn apply(&self, domain: &str, descriptors: &mut Value) -> Vec<String> {
        let mut unused = Vec::new();
        for overlay in self.entries.iter().filter(|o| o.domain == domain) {
            let place = format!("overlay {} > {}", overlay.domain, overlay.path.join(" > "));
            match find(descriptors, &overlay.path) {
                None => unused.push(format!("{place}: no such descriptor in the snapshot")),
                Some(node) => {
                    if let Err(why) = overlay.merge(node) {
                        unused.push(format!("{place}: {why}"));
                    }
                }
            }
        }
        unused
    }
}

impl Overlay {
    fn merge(&self, node: &mut Map<String, Value>) -> Result<(), &'static str> {
        let limit_fields = [
            ("algorithm", self.algorithm.clone().map(Value::from)),
            ("burst", self.burst.map(Value::from)),
            ("unit_multiplier", self.unit_multiplier.map(Value::from)),
            ("timezone", self.timezone.clone().map(Value::from)),
        ];
        let has_limit_fields = limit_fields.iter().any(|(_, value)| value.is_some());
        match node.get_mut("rate_limit").and_then(Value::as_object_mut) {
            Some(limit) => {
                for (name, value) in limit_fields {
                    if let Some(value) = value {
                        limit.insert(name.into(), value);
                    }
                }
            }
            None if has_limit_fields => return Err("the descriptor has no rate_limit to extend"),
            None => {}
        }
        if let Some(policy) = &self.on_backend_error {
            node.insert("on_backend_error".into(), policy.clone().into());
        }
        Ok(())
    }
}

/// The descriptor at `path` in `descriptors`: at each level the entry with that key and
/// value (`key` alone: the key-only entry, with no value).
fn find<'v>(descriptors: &'v mut Value, path: &[String]) -> Option<&'v mut Map<String, Value>> {
    let (first, rest) = path.split_first()?;
    let (key, value) = match first.split_once('=') {
        Some((key, value)) => (key, Some(value)),
        None => (first.as_str(), None),
    };
    let node = descriptors.as_array_mut()?.iter_mut().find_map(|entry| {
        let entry = entry.as_object_mut()?;
        let matches = entry.get("key").and_then(Value::as_str) == Some(key)
            && entry.get("value").and_then(Value::as_str) == value;
        matches.then_some(entry)
    })?;
    if rest.is_empty() {
        return Some(node);
    }
    find(node.get_mut("descriptors")?, rest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn overlays(text: &str) -> Overlays {
        toml::from_str(text).expect("overlays")
    }

    #[test]
    fn an_overlay_extends_the_limit_and_policy_of_the_descriptor_it_names() {
        let mut descriptors = json!([
            {"key": "user", "rate_limit": {"unit": "second", "requests_per_unit": 5},
             "descriptors": [{"key": "path", "value": "/v1", "rate_limit": {"unit": "minute", "requests_per_unit": 9}}]},
            {"key": "path", "value": "/v1", "rate_limit": {"unit": "minute", "requests_per_unit": 1}}
        ]);
        let unused = overlays(
            "[[overlay]]\ndomain = 'api'\npath = ['user', 'path=/v1']\nalgorithm = 'gcra'\n\
             burst = 20\non_backend_error = 'local'\n",
        )
        .apply("api", &mut descriptors);
        assert!(unused.is_empty(), "{unused:?}");
        let nested = &descriptors[0]["descriptors"][0];
        assert_eq!(nested["rate_limit"]["algorithm"], "gcra");
        assert_eq!(nested["rate_limit"]["burst"], 20);
        assert_eq!(nested["on_backend_error"], "local");
        assert_eq!(
            descriptors[1]["rate_limit"].get("algorithm"),
            None,
            "only the one named"
        );
    }

    #[test]
    fn an_overlay_that_names_nothing_or_no_limit_is_reported_and_changes_nothing() {
        let mut descriptors = json!([{"key": "user"}]);
        let before = descriptors.clone();
        let unused = overlays(
            "[[overlay]]\ndomain = 'api'\npath = ['nobody']\nburst = 2\n\
             [[overlay]]\ndomain = 'api'\npath = ['user']\nburst = 2\n\
             [[overlay]]\ndomain = 'other'\npath = ['user']\nburst = 2\n",
        )
        .apply("api", &mut descriptors);
        assert_eq!(descriptors, before);
        assert_eq!(unused.len(), 2, "{unused:?}");
        assert!(unused[0].contains("no such descriptor"), "{unused:?}");
        assert!(unused[1].contains("no rate_limit"), "{unused:?}");
    }

    #[test]
    fn the_example_overlays_file_reads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/xds/overlays.toml");
        let overlays = Overlays::read(&path, crate::rules::DEFAULT_RULES_MAX_BYTES)
            .expect("the example reads");
        assert_eq!(overlays.entries.len(), 2);
        assert_eq!(overlays.entries[1].path, ["plan=premium", "path"]);
    }

    #[test]
    fn an_unknown_field_is_an_error_naming_it() {
        let error = toml::from_str::<Overlays>("[[overlay]]\ndomain = 'a'\npath = []\nburts = 1\n")
            .expect_err("a typo");
        assert!(error.to_string().contains("burts"), "{error}");
    }
}
