//! The registry of rule statistics ([`RuleStats`], kept by the rules): by (domain, key path),
//! so that they outlive a rule reload.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::rules::RuleStats;

/// Series labelled with request values (`detailed_metric`, `value_to_metric`, request
/// overrides) beyond this many are not created: the hits of a labelled rule then count in
/// its unlabelled series, those of an override nowhere. It keeps a client that sends a new
/// value per request from growing the page (and this process) without bound.
pub const MAX_REQUEST_LABELLED_SERIES: usize = 10_000;

/// The most bytes of labels (domain and key path) the series labelled with request values
/// hold together; past it, as past [`MAX_REQUEST_LABELLED_SERIES`]. Each series is written
/// in six families, so these labels cost `/metrics` at most six times this (3 MiB), on top
/// of the series' own names: the page measured 5.0 MB at the series cap with short values,
/// 3.4 MB at the byte cap with 1 KiB ones (`tests/metrics.rs`), under 16 MB whatever
/// values clients send.
pub const MAX_REQUEST_LABELLED_BYTES: usize = 512 * 1024;

/// The labels of one series: the domain and the key path (`key1`, `key2`, …).
pub type SeriesLabels = (String, Vec<String>);

/// Every rule series ever hit, by labels, in label order (so the page is stable).
#[derive(Debug, Default)]
pub struct RuleRegistry {
    series: Mutex<Registered>,
}

#[derive(Debug, Default)]
struct Registered {
    by_labels: BTreeMap<SeriesLabels, Arc<RuleStats>>,
    request_labelled: usize,
    /// The label bytes of the series labelled with request values.
    request_labelled_bytes: usize,
}

impl RuleRegistry {
    /// The series of a configured rule path; always created.
    pub fn rule(&self, labels: SeriesLabels) -> Arc<RuleStats> {
        let mut registered = self.lock();
        registered.by_labels.entry(labels).or_default().clone()
    }

    /// A series whose labels come from a request: `None` when it is new and
    /// [`MAX_REQUEST_LABELLED_SERIES`] already exist, or its labels would take those series
    /// past [`MAX_REQUEST_LABELLED_BYTES`].
    pub fn request_labelled(&self, labels: SeriesLabels) -> Option<Arc<RuleStats>> {
        let mut registered = self.lock();
        if let Some(stats) = registered.by_labels.get(&labels) {
            return Some(stats.clone());
        }
        let bytes = labels.0.len() + labels.1.iter().map(String::len).sum::<usize>();
        if registered.request_labelled >= MAX_REQUEST_LABELLED_SERIES
            || registered.request_labelled_bytes + bytes > MAX_REQUEST_LABELLED_BYTES
        {
            return None;
        }
        registered.request_labelled += 1;
        registered.request_labelled_bytes += bytes;
        let stats = Arc::new(RuleStats::default());
        registered.by_labels.insert(labels, stats.clone());
        Some(stats)
    }

    /// Every series, in label order.
    pub fn all(&self) -> Vec<(SeriesLabels, Arc<RuleStats>)> {
        let registered = self.lock();
        (registered.by_labels.iter())
            .map(|(labels, stats)| (labels.clone(), stats.clone()))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registered> {
        // Plain data: a panic elsewhere while it was locked leaves it usable.
        self.series.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_labelled_series_stop_at_the_byte_cap() {
        let registry = RuleRegistry::default();
        let value = "v".repeat(1023);
        let labels = |i: usize| ("d".to_owned(), vec![format!("{i:08}{value}")]);
        // Each series holds 1 + 1,031 bytes of labels.
        let fit = MAX_REQUEST_LABELLED_BYTES / 1032;
        for i in 0..fit {
            assert!(registry.request_labelled(labels(i)).is_some(), "{i}");
        }
        assert!(registry.request_labelled(labels(fit)).is_none());
        assert!(
            registry.request_labelled(labels(0)).is_some(),
            "a known one stays"
        );
        let small = ("d".to_owned(), vec!["k_v".to_owned()]);
        assert!(
            registry.request_labelled(small).is_some(),
            "a small one still fits"
        );
    }

    #[test]
    fn request_labelled_series_stop_at_the_cap_but_known_ones_stay() {
        let registry = RuleRegistry::default();
        let labels = |i: usize| ("d".to_owned(), vec![format!("k_{i}")]);
        for i in 0..MAX_REQUEST_LABELLED_SERIES {
            assert!(registry.request_labelled(labels(i)).is_some());
        }
        assert!(registry.request_labelled(labels(usize::MAX)).is_none());
        assert!(registry.request_labelled(labels(0)).is_some());
        assert!(Arc::ptr_eq(
            &registry.rule(("d".into(), vec!["k".into()])),
            &registry.rule(("d".into(), vec!["k".into()]))
        ));
    }
}
