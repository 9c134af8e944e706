//! The load generator end to end: the real `floodgate-bench`'s open loop against a real
//! server, read through its machine-readable row; and `floodgate bench`, which runs it.

mod harness;

use std::collections::HashMap;
use std::process::Command;

use harness::Floodgate;

/// The load generator's binary.
const GENERATOR: &str = env!("CARGO_BIN_EXE_floodgate-bench");

/// One limit per user, far above what the test sends: every request is decided OK.
const RULES: &str = "
domain: bench
descriptors:
  - key: user_id
    rate_limit: {unit: second, requests_per_unit: 1000000}
";

/// The TSV output as column name → value.
fn parse_row(stdout: &str) -> HashMap<String, String> {
    let mut lines = stdout.lines();
    let header = lines.next().expect("a header line");
    let row = lines.next().expect("a row");
    assert_eq!(lines.next(), None, "one row only: {stdout}");
    let columns: Vec<&str> = header.split('\t').collect();
    let values: Vec<&str> = row.split('\t').collect();
    assert_eq!(columns.len(), values.len(), "{stdout}");
    columns
        .into_iter()
        .zip(values)
        .map(|(column, value)| (column.to_owned(), value.to_owned()))
        .collect()
}

fn number(row: &HashMap<String, String>, column: &str) -> f64 {
    row[column]
        .parse()
        .unwrap_or_else(|_| panic!("{column} = {:?} is not a number", row[column]))
}

#[test]
fn open_loop_run_against_the_memory_backend_decides_everything() {
    let server = Floodgate::start(&[("bench.yaml", RULES)], &[]);
    let output = Command::new(GENERATOR)
        .arg("--addr")
        .arg(format!("http://{}", server.grpc_addr))
        .args(["--rate", "200", "--duration", "1", "--warmup", "0.2"])
        .args(["--format", "tsv", "--server-pid"])
        .arg(server.pid().to_string())
        .output()
        .expect("running floodgate-bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");

    let row = parse_row(&stdout);
    assert_eq!(row["mode"], "open");
    assert_eq!(number(&row, "offered_rps"), 200.0);
    assert!(number(&row, "decided_per_s") > 0.0, "{stdout}");
    assert_eq!(number(&row, "shed_per_s"), 0.0, "{stdout}");
    assert_eq!(number(&row, "unavailable_per_s"), 0.0, "{stdout}");
    assert!(number(&row, "server_us_per_decision") >= 0.0, "{stdout}");
    assert_eq!(row["redis_cmds_per_decision"], "", "no --redis-addr given");
}

/// `floodgate bench` is the load generator beside the server's binary: the same flags, the
/// same output, its own errors.
#[test]
fn floodgate_bench_runs_the_load_generator_with_its_arguments() {
    let help = (harness::command().args(["bench", "--help"]).output()).expect("floodgate bench");
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(help.status.success(), "{help:?}");
    assert!(
        text.contains("floodgate-bench") && text.contains("--concurrency"),
        "{text}"
    );
    // A server that is not there: the generator's own error, and its failing exit.
    let refused = (harness::command())
        .args(["bench", "--addr", "http://127.0.0.1:1", "--duration", "0.1"])
        .output()
        .expect("floodgate bench");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(stderr.starts_with("floodgate-bench: "), "{stderr}");
}
