//! The Prometheus text exposition format, version 0.0.4: a `# HELP` and a `# TYPE` line per
//! metric family, then one line per sample, `name{label="value",…} value`. Label values
//! escape `\`, `"` and line feeds; help texts escape `\` and line feeds.

use std::fmt::{Display, Write};

use crate::instruments::{BOUNDS_MICROS, Snapshot};

/// The `Content-Type` of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A page of metrics being written.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    /// Starts a metric family; its samples follow.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let _ = write!(self.out, "# HELP {name} ");
        for c in help.chars() {
            match c {
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                c => self.out.push(c),
            }
        }
        let _ = writeln!(self.out, "\n# TYPE {name} {}", kind.name());
    }

    /// One sample of a counter or gauge.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl Display) {
        self.out.push_str(name);
        self.labels(labels, None);
        let _ = writeln!(self.out, " {value}");
    }

    /// A histogram's `_bucket` lines (with `+Inf`), `_sum` in seconds and `_count`.
    pub fn histogram(&mut self, name: &str, labels: &[(&str, &str)], snapshot: &Snapshot) {
        self.histogram_scaled(name, labels, snapshot, 1);
    }

    /// [`Exposition::histogram`] with its bounds and sum `scale` times what they are in
    /// seconds (1,000: milliseconds).
    pub fn histogram_scaled(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        snapshot: &Snapshot,
        scale: u32,
    ) {
        let scale = u128::from(scale);
        for (bound, count) in BOUNDS_MICROS.iter().zip(snapshot.cumulative) {
            let le = seconds(u128::from(*bound) * 1_000 * scale);
            let _ = write!(self.out, "{name}_bucket");
            self.labels(labels, Some(&le));
            let _ = writeln!(self.out, " {count}");
        }
        let _ = write!(self.out, "{name}_bucket");
        self.labels(labels, Some("+Inf"));
        let _ = writeln!(self.out, " {}", snapshot.count);
        let _ = write!(self.out, "{name}_sum");
        self.labels(labels, None);
        let sum = u128::from(snapshot.sum_nanos) * scale;
        let _ = writeln!(self.out, " {}", seconds(sum));
        let _ = write!(self.out, "{name}_count");
        self.labels(labels, None);
        let _ = writeln!(self.out, " {}", snapshot.count);
    }

    pub fn finish(self) -> String {
        self.out
    }

    /// `{a="x",b="y"}`, with `le` last when given; nothing when there are no labels.
    fn labels(&mut self, labels: &[(&str, &str)], le: Option<&str>) {
        let le = le.map(|le| ("le", le));
        let mut all = labels.iter().copied().chain(le).peekable();
        if all.peek().is_none() {
            return;
        }
        self.out.push('{');
        for (index, (name, value)) in all.enumerate() {
            if index > 0 {
                self.out.push(',');
            }
            self.out.push_str(name);
            self.out.push_str("=\"");
            escape_label_value(&mut self.out, value);
            self.out.push('"');
        }
        self.out.push('}');
    }
}

fn escape_label_value(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Nanoseconds as decimal seconds, exactly (`0.00005`, `1.5`, `0`): no float rounding.
fn seconds(nanos: u128) -> String {
    let whole = nanos / 1_000_000_000;
    let fraction = nanos % 1_000_000_000;
    if fraction == 0 {
        return whole.to_string();
    }
    let digits = format!("{fraction:09}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_escape_backslash_quote_and_line_feed() {
        let mut page = Exposition::default();
        page.sample("m", &[("key1", "a\\b\"c\nd")], 1);
        assert_eq!(page.finish(), "m{key1=\"a\\\\b\\\"c\\nd\"} 1\n");
    }

    #[test]
    fn help_escapes_backslash_and_line_feed_but_not_quotes() {
        let mut page = Exposition::default();
        page.family("m", Kind::Counter, "a \"b\" \\ c\nd");
        assert_eq!(
            page.finish(),
            "# HELP m a \"b\" \\\\ c\\nd\n# TYPE m counter\n"
        );
    }

    #[test]
    fn a_sample_without_labels_has_no_braces() {
        let mut page = Exposition::default();
        page.sample("up", &[], 1);
        assert_eq!(page.finish(), "up 1\n");
    }

    #[test]
    fn a_histogram_has_every_bucket_then_inf_sum_and_count() {
        let histogram = super::super::Histogram::default();
        histogram.observe(std::time::Duration::from_micros(300));
        histogram.observe(std::time::Duration::from_secs(2));
        let mut page = Exposition::default();
        page.histogram("d", &[("method", "M")], &histogram.snapshot());
        let page = page.finish();
        let lines: Vec<&str> = page.lines().collect();
        assert_eq!(lines.len(), BOUNDS_MICROS.len() + 3);
        assert_eq!(lines[0], "d_bucket{method=\"M\",le=\"0.000001\"} 0");
        assert_eq!(lines[7], "d_bucket{method=\"M\",le=\"0.00025\"} 0");
        assert_eq!(lines[8], "d_bucket{method=\"M\",le=\"0.0005\"} 1");
        assert_eq!(lines[18], "d_bucket{method=\"M\",le=\"1\"} 1");
        assert_eq!(lines[19], "d_bucket{method=\"M\",le=\"+Inf\"} 2");
        assert_eq!(lines[20], "d_sum{method=\"M\"} 2.0003");
        assert_eq!(lines[21], "d_count{method=\"M\"} 2");
    }
}
