//! floodgate's extensions for rules that arrive over xDS. envoyproxy/ratelimit's
//! `RateLimitConfig` carries a unit, a count and a name; an overlay adds, to the descriptor a
//! domain and path name, what a rule file would say of it: `algorithm`, `burst`,
//! `unit_multiplier`, `timezone`, `lease` (on its limit) and `on_backend_error`. Overlays
//! come from
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

use std::cell::Cell;

use serde::Deserialize;

use crate::files::{self, FileError};
use crate::proto::ratelimit::config::ratelimit::v3::RateLimitDescriptor;

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
    pub lease: Option<bool>,
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

    /// The overlays of `domain`, to merge into its descriptors as they are written.
    pub fn of_domain(&self, domain: &str) -> DomainOverlays<'_> {
        let entries: Vec<&Overlay> = (self.entries.iter())
            .filter(|overlay| overlay.domain == domain)
            .collect();
        let outcomes = entries.iter().map(|_| Cell::new(Fate::Unmatched)).collect();
        DomainOverlays { entries, outcomes }
    }
}

/// The overlays of one domain while its descriptors are written: what each descriptor gets,
/// and which overlays changed nothing.
pub struct DomainOverlays<'o> {
    entries: Vec<&'o Overlay>,
    /// What became of each entry so far.
    outcomes: Vec<Cell<Fate>>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Fate {
    Unmatched,
    /// It names a descriptor without a `rate_limit` and has limit fields to add.
    NoLimit,
    Applied,
}

/// What the overlays naming one descriptor add to it, a later overlay's field winning.
#[derive(Default)]
pub struct Additions<'o> {
    pub algorithm: Option<&'o str>,
    pub burst: Option<u64>,
    pub unit_multiplier: Option<u64>,
    pub timezone: Option<&'o str>,
    pub lease: Option<bool>,
    pub on_backend_error: Option<&'o str>,
}

impl<'o> DomainOverlays<'o> {
    /// Every overlay of the domain: those whose path may lead from the domain's top level.
    pub fn all(&self) -> Vec<usize> {
        (0..self.entries.len()).collect()
    }

    /// Of `candidates` (overlays whose path leads to this level, `depth` below the domain),
    /// what those naming `descriptor` add to it, and those whose path goes on below it.
    pub fn at(
        &self,
        candidates: &[usize],
        depth: usize,
        descriptor: &RateLimitDescriptor,
    ) -> (Additions<'o>, Vec<usize>) {
        let mut additions = Additions::default();
        let mut deeper = Vec::new();
        for &index in candidates {
            let overlay = self.entries[index];
            if !(overlay.path.get(depth)).is_some_and(|step| names(step, descriptor)) {
                continue;
            }
            if overlay.path.len() > depth + 1 {
                deeper.push(index);
                continue;
            }
            let outcome = if descriptor.rate_limit.is_none() && overlay.has_limit_fields() {
                Fate::NoLimit
            } else {
                overlay.add_to(&mut additions);
                Fate::Applied
            };
            // One descriptor it applied to is enough, whatever a duplicate of it had.
            if self.outcomes[index].get() != Fate::Applied {
                self.outcomes[index].set(outcome);
            }
        }
        (additions, deeper)
    }

    /// The overlays that changed nothing, each saying why.
    pub fn unused(&self) -> Vec<String> {
        (self.entries.iter().zip(&self.outcomes))
            .filter_map(|(overlay, outcome)| {
                let why = match outcome.get() {
                    Fate::Applied => return None,
                    Fate::Unmatched => "no such descriptor in the snapshot",
                    Fate::NoLimit => "the descriptor has no rate_limit to extend",
                };
                let path = overlay.path.join(" > ");
                Some(format!("overlay {} > {path}: {why}", overlay.domain))
            })
            .collect()
    }
}

impl Overlay {
    fn has_limit_fields(&self) -> bool {
        self.algorithm.is_some()
            || self.burst.is_some()
            || self.unit_multiplier.is_some()
            || self.timezone.is_some()
            || self.lease.is_some()
    }

    fn add_to<'o>(&'o self, additions: &mut Additions<'o>) {
        let or = |mine: Option<&'o String>, before| mine.map(String::as_str).or(before);
        additions.algorithm = or(self.algorithm.as_ref(), additions.algorithm);
        additions.burst = self.burst.or(additions.burst);
        additions.unit_multiplier = self.unit_multiplier.or(additions.unit_multiplier);
        additions.timezone = or(self.timezone.as_ref(), additions.timezone);
        additions.lease = self.lease.or(additions.lease);
        additions.on_backend_error = or(self.on_backend_error.as_ref(), additions.on_backend_error);
    }
}

/// Whether a step of an overlay's path names `descriptor`: `key=value` the entry with that
/// key and value, `key` alone the key-only entry, with no value.
fn names(step: &str, descriptor: &RateLimitDescriptor) -> bool {
    match step.split_once('=') {
        Some((key, value)) => {
            descriptor.key == key && !value.is_empty() && descriptor.value == value
        }
        None => descriptor.key == step && descriptor.value.is_empty(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
