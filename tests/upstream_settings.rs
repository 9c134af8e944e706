//! Every one of envoyproxy/ratelimit's environment variables is honoured by `floodgate
//! ratelimit`, or named at start as not honoured with why, and has its row in
//! docs/migration.md. The variables are data (`tests/upstream/settings.tsv`, with the
//! upstream version they were read from); a variable the translation neither reads nor
//! names, or the migration guide leaves out, fails here.

use std::collections::BTreeMap;
use std::process::Command;

const SETTINGS: &str = include_str!("upstream/settings.tsv");
const MIGRATION: &str = include_str!("../docs/migration.md");

/// What each group of the data sets besides its own variables: the switches under which
/// upstream reads them (TLS files only with TLS on, a per-second Redis only with
/// `REDIS_PERSECOND`, …).
fn base(group: &str) -> Vec<(&'static str, &'static str)> {
    match group {
        "files" => vec![
            (
                "DOG_STATSD_MOGRIFIER_TAG_PATTERN",
                r"^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.(.*)$",
            ),
            (
                "DOG_STATSD_MOGRIFIER_TAG_NAME",
                "ratelimit.service.rate_limit.$3",
            ),
            ("DOG_STATSD_MOGRIFIER_TAG_TAGS", "domain:$1,descriptor:$2"),
        ],
        "xds" | "nostats" => vec![],
        other => panic!("no group {other:?}"),
    }
}

struct Variable {
    name: String,
    sample: String,
    group: String,
}

fn variables() -> Vec<Variable> {
    (SETTINGS.lines())
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .map(|line| {
            let columns: Vec<&str> = line.split('\t').collect();
            assert_eq!(columns.len(), 4, "four columns in {line:?}");
            Variable {
                name: columns[0].to_owned(),
                sample: columns[2].to_owned(),
                group: columns[3].to_owned(),
            }
        })
        .collect()
}

/// `floodgate ratelimit --explain` with `env` alone: the variables it lists as honoured,
/// and those it names as not honoured, with why.
fn explain(env: &[(&str, &str)]) -> (Vec<String>, BTreeMap<String, String>) {
    let output = Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .args(["ratelimit", "--explain"])
        .env_clear()
        .envs(env.iter().copied())
        .output()
        .expect("floodgate runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut honoured = Vec::new();
    let mut not_honoured = BTreeMap::new();
    let mut section = "";
    for line in stdout.lines() {
        match line.strip_prefix("  ") {
            None => section = line,
            Some(item) if section == "honoured:" => honoured.push(item.to_owned()),
            Some(item) if section == "not honoured:" => {
                let (name, why) = item.split_once(": ").expect("name: why");
                not_honoured.insert(name.to_owned(), why.to_owned());
            }
            Some(_) => {}
        }
    }
    (honoured, not_honoured)
}

#[test]
fn the_data_holds_every_variable_once() {
    let variables = variables();
    let mut names: Vec<&str> = variables.iter().map(|v| v.name.as_str()).collect();
    names.sort_unstable();
    let count = names.len();
    names.dedup();
    assert_eq!(names.len(), count, "a variable listed twice");
    assert!(
        count >= 113,
        "upstream has 113 variables or more; the data holds {count}"
    );
}

#[test]
fn every_upstream_variable_is_honoured_or_named_as_not_honoured() {
    let variables = variables();
    let mut groups: BTreeMap<&str, Vec<&Variable>> = BTreeMap::new();
    for variable in &variables {
        groups.entry(&variable.group).or_default().push(variable);
    }
    let mut missing = Vec::new();
    for (group, members) in groups {
        let mut env = base(group);
        env.extend(members.iter().map(|v| (v.name.as_str(), v.sample.as_str())));
        let (honoured, not_honoured) = explain(&env);
        for variable in members {
            let named = not_honoured.get(&variable.name);
            assert!(
                named.is_none_or(|why| why.len() > 10),
                "{} is named without a reason: {named:?}",
                variable.name
            );
            if !honoured.contains(&variable.name) && named.is_none() {
                missing.push(format!("{}={} ({group})", variable.name, variable.sample));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "neither honoured nor named as not honoured: {missing:#?}"
    );
}

#[test]
fn every_upstream_variable_has_its_row_in_the_migration_guide() {
    let table: String = (MIGRATION.lines())
        .skip_while(|line| !line.starts_with("## Settings"))
        .take_while(|line| !line.starts_with("## Rules"))
        .filter(|line| line.starts_with('|'))
        .collect::<Vec<_>>()
        .join("\n");
    let missing: Vec<String> = (variables().into_iter())
        .map(|variable| variable.name)
        .filter(|name| !table.contains(&format!("`{name}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/migration.md's settings table lacks: {missing:?}"
    );
}

#[test]
fn a_variable_that_changes_nothing_here_says_why_at_start() {
    let (_, not_honoured) = explain(&[
        ("REDIS_POOL_ON_EMPTY_BEHAVIOR", "ERROR"),
        ("DEBUG_PORT", "7070"),
    ]);
    assert!(not_honoured["REDIS_POOL_ON_EMPTY_BEHAVIOR"].contains("redis_max_wait_ms"));
    assert!(not_honoured["DEBUG_PORT"].contains("HTTP port"));
}
