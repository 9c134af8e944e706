//! A report as one tab-separated row, for scripts that collect many runs into a curve
//! (`scripts/bench.sh` with `CURVE=...`). A value that was not measured is an empty field.

use super::cpu::Process;
use super::report::{Mode, Report};

/// The columns, in order. Rates are per second; decisions are decided requests times
/// descriptors per request; latency percentiles are of decided requests, from schedule in the
/// open loop.
pub const COLUMNS: [&str; 16] = [
    "mode",
    "offered_rps",
    "concurrency",
    "descriptors",
    "decided_per_s",
    "shed_per_s",
    "unavailable_per_s",
    "errors_per_s",
    "dropped_per_s",
    "p50_ms",
    "p99_ms",
    "p999_ms",
    "server_us_per_decision",
    "redis_us_per_decision",
    "loadgen_us_per_decision",
    "redis_cmds_per_decision",
];

pub fn header() -> String {
    COLUMNS.join("\t")
}

/// The report's values, in the order of [`COLUMNS`].
pub fn row(report: &Report) -> String {
    let (mode, offered, concurrency) = match report.mode {
        Mode::Closed { concurrency } => ("closed", String::new(), concurrency.to_string()),
        Mode::Open { rate, .. } => ("open", rate.to_string(), String::new()),
    };
    let counts = &report.counts;
    let per_second = |count| format!("{:.1}", report.per_second(count));
    let millis = |q| format!("{:.3}", report.latency.percentile_ms(q));
    let cpu = |who| optional(report.cpu_micros_per_decision(who), 2);
    let fields = [
        mode.to_owned(),
        offered,
        concurrency,
        report.descriptors_per_request.to_string(),
        per_second(counts.decided),
        per_second(counts.shed),
        per_second(counts.unavailable),
        per_second(counts.errors),
        per_second(counts.dropped),
        millis(0.50),
        millis(0.99),
        millis(0.999),
        cpu(Process::Server),
        cpu(Process::Redis),
        cpu(Process::LoadGen),
        optional(report.redis_commands_per_decision(), 4),
    ];
    fields.join("\t")
}

fn optional(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(String::new, |value| format!("{value:.decimals$}"))
}

#[cfg(test)]
mod tests {
    use super::super::redis_commands::CommandCounts;
    use super::super::report::tests::report;
    use super::*;

    fn fields(row: &str) -> Vec<&str> {
        row.split('\t').collect()
    }

    #[test]
    fn the_header_names_every_column_once() {
        assert_eq!(fields(&header()), COLUMNS);
    }

    #[test]
    fn a_closed_loop_row_has_concurrency_and_no_offered_rate() {
        let row = row(&report());
        assert_eq!(
            fields(&row),
            [
                "closed", "", "64", "2", "500.0", "5.0", "0.0", "0.0", "0.0", "0.500", "0.990",
                "0.999", "250.00", "", "125.00", ""
            ]
        );
    }

    #[test]
    fn an_open_loop_row_has_the_offered_rate_and_no_concurrency() {
        let mut report = report();
        report.mode = Mode::Open {
            rate: 20000.0,
            max_in_flight: 50_000,
        };
        report.counts.dropped = 3;
        report.redis_commands = Some(CommandCounts::parse("cmdstat_evalsha:calls=2001"));
        let row = row(&report);
        let fields = fields(&row);
        assert_eq!(fields.len(), COLUMNS.len());
        assert_eq!(&fields[..3], ["open", "20000", ""]);
        assert_eq!(fields[8], "1.5");
        assert_eq!(fields[15], "1.0005");
    }
}
