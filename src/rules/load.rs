//! Rule files → [`RuleSet`]: envoyproxy/ratelimit's YAML format with floodgate's extensions,
//! walked by hand from a marked YAML tree so every error names its file, line and rule.
//!
//! Loading is all or nothing: every problem in every file is collected, and a load with any
//! problem returns them all and keeps nothing, so a bad edit never half-applies.

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::Path;

use saphyr::MarkedYaml;

use super::descriptor::read_descriptors;
use super::reader::Reader;
use super::yaml::{self, Document};
use super::{Descriptors, Domain, RuleSet, Source};
use crate::files::{self, FileError, Unreadable};

/// One problem in a rule file: where it is and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {rule}: {message}")]
pub struct LoadError {
    pub file: String,
    /// 1-based; 0 when the problem is the file or directory as a whole (it cannot be read).
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

/// The rule path of problems that belong to no domain yet.
const WHOLE_FILE: &str = "(file)";

const FILE_KEYS: [&str; 2] = ["domain", "descriptors"];

impl RuleSet {
    /// Loads every `*.yaml` / `*.yml` file of `dir`, sorted by name. Not recursive, and files
    /// whose name starts with `.` are skipped, so a Kubernetes ConfigMap volume (whose files
    /// are also reachable through its `..data` directory) is read once.
    /// Reads at most `max_bytes` of rule files in all ([`RuleFiles::read`]).
    pub fn load_dir(dir: &Path, max_bytes: u64) -> Result<RuleSet, LoadErrors> {
        RuleFiles::read(dir, max_bytes).load()
    }

    /// Loads rule files given as (file name, contents), in the order given.
    pub fn from_sources(sources: &[(String, String)]) -> Result<RuleSet, LoadErrors> {
        load(sources, Vec::new(), false)
    }
}

/// A rules directory as the loader reads it: the contents of every rule file, and the files
/// it could not read. Reading is separate from loading so that a reload can compare what is
/// on disk now with what it loaded last (two equal readings load equal rule sets), and act
/// only on a change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleFiles {
    /// (path, contents), sorted by path.
    sources: Vec<(String, String)>,
    errors: Vec<LoadError>,
    /// Files of one domain add up (`merge_domain_config`, upstream's `MERGE_DOMAIN_CONFIG`)
    /// instead of being an error.
    merge_domains: bool,
}

impl RuleFiles {
    /// Reads the rule files of `dir` ([`RuleSet::load_dir`] says which), following symbolic
    /// links. Never fails: a file that cannot be read becomes a load error, and so does one
    /// that would take the files read past `max_bytes` together (a load holds several times
    /// the files' size while it parses them; [`DEFAULT_RULES_MAX_BYTES`]).
    pub fn read(dir: &Path, max_bytes: u64) -> RuleFiles {
        let (sources, errors) = read_dir(dir, max_bytes);
        RuleFiles {
            sources,
            errors,
            merge_domains: false,
        }
    }

    /// These files, with several files of one domain merged into it when `merge` holds:
    /// their top-level descriptors add up, and one that two files define is an error.
    pub fn merging_domains(self, merge: bool) -> RuleFiles {
        RuleFiles {
            merge_domains: merge,
            ..self
        }
    }

    /// Whether files of one domain are merged.
    pub fn merges_domains(&self) -> bool {
        self.merge_domains
    }

    /// Builds the rule set these files describe, or every problem in them.
    pub fn load(&self) -> Result<RuleSet, LoadErrors> {
        load(&self.sources, self.errors.clone(), self.merge_domains)
    }
}

/// The default bound on the rule files of one directory, all together: 2 MiB. A load peaks
/// at about 60 times the bytes it parses, so the default stays well inside the Helm chart's
/// 288 MiB memory limit; a Kubernetes ConfigMap holds at most 1 MiB.
pub const DEFAULT_RULES_MAX_BYTES: u64 = 2 * 1024 * 1024;

/// The rule files of `dir` as (path, contents), and an error for each that cannot be read.
fn read_dir(dir: &Path, max_bytes: u64) -> (Vec<(String, String)>, Vec<LoadError>) {
    let whole = |file: &Path, message: String| LoadError {
        file: file.display().to_string(),
        line: 0,
        rule: WHOLE_FILE.to_owned(),
        message,
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            return (
                Vec::new(),
                vec![whole(dir, format!("cannot read the rules directory: {e}"))],
            );
        }
    };
    let mut paths: Vec<_> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| is_rule_file(path))
        .collect();
    paths.sort();
    let mut sources = Vec::with_capacity(paths.len());
    let mut errors = Vec::new();
    let mut total: u64 = 0;
    for path in paths {
        let room = max_bytes.saturating_sub(total);
        match files::read_to_string(&path, room) {
            Ok(text) => {
                total += text.len() as u64;
                sources.push((path.display().to_string(), text));
            }
            Err(FileError {
                problem: Unreadable::TooBig { size, .. },
                ..
            }) => {
                let message = format!(
                    "the rule files reach {} bytes with this one ({size} bytes), above \
                     rules_max_bytes ({max_bytes}); raise the setting or trim the rules",
                    total + size
                );
                errors.push(whole(&path, message));
            }
            // A dangling link, a loop of links or something other than a file is an error
            // naming the file, so its domain is not silently dropped.
            Err(error) => {
                let message = format!("cannot read the rule file: {}", error.problem);
                errors.push(whole(&path, message));
            }
        }
    }
    (sources, errors)
}

/// A visible `*.yaml` / `*.yml` name (whatever it leads to: [`read_dir`] says when that is
/// not a readable file; symbolic links are followed, as ConfigMap volumes use them).
fn is_rule_file(path: &Path) -> bool {
    let visible = path
        .file_name()
        .and_then(|name| name.to_str())
        .is_some_and(|name| !name.starts_with('.'));
    let yaml = path
        .extension()
        .and_then(|ext| ext.to_str())
        .is_some_and(|ext| ext.eq_ignore_ascii_case("yaml") || ext.eq_ignore_ascii_case("yml"));
    visible && yaml
}

fn load(
    sources: &[(String, String)],
    mut errors: Vec<LoadError>,
    merge_domains: bool,
) -> Result<RuleSet, LoadErrors> {
    let mut domains: BTreeMap<String, Domain> = BTreeMap::new();
    for (file, text) in sources {
        let (domain, file_errors) = load_file(file, text);
        errors.extend(file_errors);
        let Some(domain) = domain else { continue };
        match domains.get_mut(&domain.name) {
            Some(first) if merge_domains => merge(first, domain, &mut errors),
            Some(first) => errors.push(LoadError {
                file: file.clone(),
                line: domain.source.line,
                rule: format!("domain {}", domain.name),
                message: format!(
                    "duplicate domain: `{}` is already defined at {}:{} (merge_domain_config \
                     merges the files of one domain)",
                    domain.name, first.source.file, first.source.line
                ),
            }),
            None => {
                domains.insert(domain.name.clone(), domain);
            }
        }
    }
    if errors.is_empty() {
        Ok(RuleSet {
            domains,
            origin: super::Origin::Files,
        })
    } else {
        Err(LoadErrors(errors))
    }
}

/// Adds `more`'s descriptors to `into`, the same domain from an earlier file; each
/// top-level descriptor both define is an error naming the two places.
fn merge(into: &mut Domain, more: Domain, errors: &mut Vec<LoadError>) {
    let name = into.name.clone();
    let first_source = into.source.clone();
    let place = |node: &super::DescriptorNode, domain: &Source| {
        (node.rule.as_ref()).map_or_else(|| domain.clone(), |rule| rule.source.clone())
    };
    for (node, earlier) in into.descriptors.merge(more.descriptors) {
        let here = place(&node, &more.source);
        let there = place(earlier, &first_source);
        let what = match &node.value {
            Some(value) => format!("{}={value}", node.key),
            None => node.key.clone(),
        };
        errors.push(LoadError {
            file: here.file,
            line: here.line,
            rule: format!("domain {name} > {what}"),
            message: format!(
                "duplicate descriptor: `{what}` is already defined for domain `{name}` at \
                 {}:{} (merge_domain_config merges a domain's files, not their descriptors)",
                there.file, there.line
            ),
        });
    }
}

/// One file's domain (when it names one) and its problems.
fn load_file(file: &str, text: &str) -> (Option<Domain>, Vec<LoadError>) {
    let document = match Document::parse(text) {
        Ok(document) => document,
        Err(e) => {
            // The parser may place an error at end of input one line past the last one.
            let last_line = text.lines().count().max(1);
            let error = LoadError {
                file: file.to_owned(),
                line: e.line.min(last_line),
                rule: WHOLE_FILE.to_owned(),
                message: format!("invalid YAML: {}", e.message),
            };
            return (None, vec![error]);
        }
    };
    let mut reader = Reader::new(file, &document);
    let domain = match &document.root {
        Some(root) if !yaml::is_null(root) => read_domain(&mut reader, root),
        _ => {
            let message = "no domain: the file holds no rules (start it with `domain: <name>`)";
            reader.error(1, WHOLE_FILE, message);
            None
        }
    };
    (domain, reader.errors)
}

fn read_domain(reader: &mut Reader<'_, '_>, root: &MarkedYaml<'_>) -> Option<Domain> {
    let path = match yaml::peek(root, "domain") {
        Some(name) if !name.is_empty() => format!("domain {name}"),
        _ => WHOLE_FILE.to_owned(),
    };
    let fields = reader.fields(root, "the rule file", &FILE_KEYS, &path)?;
    let (line, name) = match fields.entry("domain") {
        None => {
            let message = "no domain: write `domain: <name>` at the top of the file";
            reader.error(fields.line, &path, message);
            return None;
        }
        Some((line, node)) => (line, reader.string(node, "domain", &path)?),
    };
    if name.is_empty() {
        reader.error(line, &path, "empty domain: write `domain: <name>`");
        return None;
    }
    let descriptors = match fields.get("descriptors") {
        None => Descriptors::default(),
        Some(node) => {
            let items = reader.list(node, "descriptors", &path).unwrap_or_default();
            read_descriptors(reader, items, &path, &name)
        }
    };
    Some(Domain {
        source: Source {
            file: reader.file().to_owned(),
            line,
        },
        name,
        descriptors,
    })
}
