//! `floodgate check-config` and start-up with bad rules: every load error names the file,
//! the line and the rule, and nothing starts on a broken rule set.

mod harness;

use harness::{command, write_rules};

/// Runs `check-config` on `files`: (exit code, stdout, stderr).
fn check(files: &[(&str, &str)]) -> (i32, String, String) {
    let dir = write_rules(files);
    let output = command()
        .arg("check-config")
        .arg(dir.path())
        .output()
        .expect("runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn assert_error(files: &[(&str, &str)], file: &str, line: usize, words: &[&str]) {
    let (code, _, stderr) = check(files);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains(&format!("{file}:{line}:")),
        "expected {file}:{line} in {stderr}"
    );
    for word in words {
        assert!(stderr.contains(word), "expected {word:?} in {stderr}");
    }
}

#[test]
fn good_rules_pass_with_a_summary() {
    let (code, stdout, stderr) = check(&[(
        "a.yaml",
        "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    )]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("1 domains, 1 rules"), "{stdout}");
}

#[test]
fn repository_example_rules_pass() {
    let status = command()
        .args([
            "check-config",
            concat!(env!("CARGO_MANIFEST_DIR"), "/examples/rules"),
        ])
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn unknown_key_names_file_line_and_rule() {
    let yaml = "domain: a\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      burts: 3\n";
    assert_error(&[("a.yaml", yaml)], "a.yaml", 7, &["burts", "user"]);
}

#[test]
fn duplicate_domain_across_files_is_an_error() {
    let yaml = "domain: a\ndescriptors: []\n";
    assert_error(
        &[("a.yaml", yaml), ("b.yaml", yaml)],
        "b.yaml",
        1,
        &["duplicate", "a"],
    );
}

#[test]
fn duplicate_descriptor_is_an_error() {
    let yaml = "domain: a\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n";
    assert_error(&[("a.yaml", yaml)], "a.yaml", 5, &["duplicate"]);
}

#[test]
fn bad_unit_is_an_error() {
    let yaml = "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n";
    assert_error(&[("a.yaml", yaml)], "a.yaml", 5, &["fortnight"]);
}

#[test]
fn unlimited_with_a_unit_is_an_error() {
    let yaml = "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      unit: second\n";
    assert_error(&[("a.yaml", yaml)], "a.yaml", 6, &["unlimited"]);
}

#[test]
fn replaces_naming_itself_is_an_error() {
    let yaml = "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      name: self\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: self\n";
    let (code, _, stderr) = check(&[("a.yaml", yaml)]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("a.yaml:") && stderr.contains("self"),
        "{stderr}"
    );
}

#[test]
fn bad_yaml_is_an_error_with_its_line() {
    let yaml = "domain: a\ndescriptors:\n  - key: k\n    rate_limit: [unclosed\n";
    let (code, _, stderr) = check(&[("a.yaml", yaml)]);
    assert_eq!(code, 1);
    assert!(stderr.contains("a.yaml:"), "{stderr}");
}

#[test]
fn wrong_type_is_an_error() {
    let yaml = "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: ten\n";
    assert_error(&[("a.yaml", yaml)], "a.yaml", 6, &["requests_per_unit"]);
}

#[test]
fn serve_refuses_to_start_on_bad_rules() {
    let dir = write_rules(&[(
        "a.yaml",
        "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: eon}\n",
    )]);
    let output = command()
        .args([
            "serve",
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--rules",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("a.yaml:4"), "{stderr}");
}

#[test]
fn a_rule_name_that_leads_nowhere_readable_is_an_error_naming_it() {
    let dir = write_rules(&[(
        "a.yaml",
        "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    )]);
    let path = |name: &str| dir.path().join(name);
    std::os::unix::fs::symlink(path("nowhere.yaml"), path("dangling.yaml")).expect("a link");
    std::os::unix::fs::symlink(path("loop.yaml"), path("loop.yaml")).expect("a loop");
    let fifo = std::process::Command::new("mkfifo")
        .arg(path("pipe.yaml"))
        .status()
        .expect("mkfifo runs");
    assert!(fifo.success());
    // A FIFO would block a plain read: `timeout` turns a hang into a failure.
    let output = std::process::Command::new("timeout")
        .arg("20")
        .arg(harness::BINARY)
        .arg("check-config")
        .arg(dir.path())
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    for name in ["dangling.yaml", "loop.yaml", "pipe.yaml"] {
        assert!(
            stderr
                .lines()
                .any(|line| line.contains(name) && line.contains("cannot read the rule file")),
            "{name} in {stderr}"
        );
    }
    assert!(stderr.contains("not a regular file"), "{stderr}");
}

#[test]
fn nesting_a_hundred_thousand_levels_deep_is_an_error_not_a_crash() {
    let yaml = format!("domain: a\nmetadata:\n{}x\n", "- ".repeat(100_000));
    assert_error(&[("a.yaml", &yaml)], "a.yaml", 3, &["nests at most 100"]);
}
