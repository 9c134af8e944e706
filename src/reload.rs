//! Hot reload of the rules directory: a running server picks up edited rule files without a
//! restart, on a timer and at once on SIGHUP.
//!
//! Changes are found by reading the rule files the loader would read (following symbolic
//! links) and comparing them with the files last acted on, not by filesystem notifications:
//! a Kubernetes ConfigMap volume changes by swapping its `..data` symbolic link, which
//! inotify watches on the files do not report reliably, while a reading sees the new
//! contents whatever way they arrived. Rule files are small, so reading them every interval
//! costs next to nothing.
//!
//! A new rule set is loaded whole and put in force with one atomic swap, or rejected whole
//! with its errors logged, the rules in force staying as they were.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{Interval, MissedTickBehavior};

use crate::rules::{RuleFiles, RuleSet};
use crate::service::RateLimiter;

/// Keeps the limiter's rules in line with the rules directory.
pub struct Reloader {
    dir: Arc<Path>,
    /// `rules_max_bytes`: the most the rule files may hold together.
    max_bytes: u64,
    /// `merge_domain_config`: files of one domain add up.
    merge_domains: bool,
    limiter: Arc<RateLimiter>,
    change: Change,
}

impl Reloader {
    /// A reloader for `dir`, whose `files` the limiter's rules were loaded from at start-up
    /// (the limiter counted that load). Every reload is counted in the limiter's metrics
    /// (`ratelimit_service_config_load_success` / `_error`): a growing error count says the
    /// rules in force are not the ones on disk.
    pub fn new(dir: &Path, max_bytes: u64, files: RuleFiles, limiter: Arc<RateLimiter>) -> Self {
        Reloader {
            dir: dir.into(),
            max_bytes,
            merge_domains: files.merges_domains(),
            limiter,
            change: Change::new(files),
        }
    }

    /// Runs in the background: every `interval` (`None`: never) a changed directory is
    /// reloaded, and on every SIGHUP the directory is reloaded at once, changed or not.
    pub fn spawn(mut self, interval: Option<Duration>, mut hangups: Hangups) -> JoinHandle<()> {
        let mut ticks = interval.map(|period| {
            let mut ticks = tokio::time::interval(period);
            ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
            ticks
        });
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = next_tick(&mut ticks) => self.look().await,
                    () = hangups.received() => {
                        tracing::info!(dir = %self.dir.display(), "SIGHUP: reloading the rules");
                        self.reload().await;
                    }
                }
            }
        })
    }

    /// Reads the directory and loads it if it changed and has stayed so since the last look.
    async fn look(&mut self) {
        let Some(files) = self.read().await else {
            return;
        };
        if let Some(files) = self.change.observe(files) {
            let loaded = files.load();
            self.apply(loaded);
        }
    }

    /// Reads the directory and loads it, whatever it holds.
    async fn reload(&mut self) {
        let Some(files) = self.read().await else {
            return;
        };
        let loaded = files.load();
        self.change.acted_on(files);
        self.apply(loaded);
    }

    /// The rule files as they are now, read off the async workers. `None` only when the
    /// runtime is shutting down (or the read panicked, which the panic hook has reported).
    async fn read(&self) -> Option<RuleFiles> {
        let (dir, max_bytes) = (self.dir.clone(), self.max_bytes);
        let merge = self.merge_domains;
        tokio::task::spawn_blocking(move || RuleFiles::read(&dir, max_bytes).merging_domains(merge))
            .await
            .ok()
    }

    /// Puts a loaded rule set in force, or logs why it was rejected.
    fn apply(&self, loaded: Result<RuleSet, crate::rules::LoadErrors>) {
        let dir = self.dir.display();
        match loaded {
            Ok(rules) => {
                let domains = rules.domains.len();
                let count = rules.rules().count();
                self.limiter.replace_rules(rules);
                self.limiter.metrics().config_loads().record(true);
                tracing::info!(dir = %dir, domains, rules = count, "rules reloaded");
            }
            Err(errors) => {
                self.limiter.metrics().config_loads().record(false);
                for error in &errors.0 {
                    tracing::error!("rule reload rejected: {error}");
                }
                tracing::error!(
                    dir = %dir,
                    errors = errors.0.len(),
                    "rules not reloaded: the rules loaded before stay in force"
                );
            }
        }
    }
}

/// Decides when a reading of the directory is loaded: when it differs from the files last
/// acted on and the next look reads the same again. A file caught half-written, or a
/// directory caught between two steps of an update, is then neither loaded nor reported as
/// broken; the update is loaded one interval later, once it is complete.
struct Change {
    /// The files last loaded or rejected.
    acted_on: RuleFiles,
    /// A different reading seen at the last look, waiting to be seen once more.
    pending: Option<RuleFiles>,
}

impl Change {
    fn new(loaded: RuleFiles) -> Self {
        Change {
            acted_on: loaded,
            pending: None,
        }
    }

    /// Takes in a reading; returns the files to load now, if any.
    fn observe(&mut self, files: RuleFiles) -> Option<&RuleFiles> {
        if files == self.acted_on {
            self.pending = None;
            return None;
        }
        if self.pending.as_ref() != Some(&files) {
            self.pending = Some(files);
            return None;
        }
        self.acted_on(files);
        Some(&self.acted_on)
    }

    /// Records that `files` were loaded (or rejected) without waiting for a second look.
    fn acted_on(&mut self, files: RuleFiles) {
        self.acted_on = files;
        self.pending = None;
    }
}

/// Waits for the next tick; forever when reloading on a timer is off.
async fn next_tick(ticks: &mut Option<Interval>) {
    match ticks {
        Some(ticks) => {
            ticks.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// SIGHUP, registered when created: its default action ends the process, so it must be
/// caught from before the server announces itself.
pub struct Hangups {
    #[cfg(unix)]
    signal: tokio::signal::unix::Signal,
}

impl Hangups {
    pub fn register() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Hangups {
                signal: signal(SignalKind::hangup())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Hangups {})
    }

    /// Resolves on the next SIGHUP (never where there are no signals).
    async fn received(&mut self) {
        #[cfg(unix)]
        if self.signal.recv().await.is_some() {
            return;
        }
        std::future::pending().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rules directory whose one file is rewritten before each reading.
    struct Dir(tempfile::TempDir);

    impl Dir {
        fn new() -> Self {
            Dir(tempfile::tempdir().expect("tempdir"))
        }

        fn read(&self, text: &str) -> RuleFiles {
            std::fs::write(self.0.path().join("a.yaml"), text).expect("write");
            RuleFiles::read(self.0.path(), crate::rules::DEFAULT_RULES_MAX_BYTES)
        }
    }

    #[test]
    fn an_unchanged_directory_is_never_loaded() {
        let dir = Dir::new();
        let mut change = Change::new(dir.read("domain: a\n"));
        assert!(change.observe(dir.read("domain: a\n")).is_none());
        assert!(change.observe(dir.read("domain: a\n")).is_none());
    }

    #[test]
    fn a_change_is_loaded_once_two_looks_agree() {
        let dir = Dir::new();
        let mut change = Change::new(dir.read("domain: a\n"));
        assert!(change.observe(dir.read("domain: b\n")).is_none());
        let loaded = change.observe(dir.read("domain: b\n")).cloned();
        assert_eq!(loaded, Some(dir.read("domain: b\n")));
        assert!(change.observe(dir.read("domain: b\n")).is_none());
    }

    #[test]
    fn a_change_still_in_progress_waits() {
        let dir = Dir::new();
        let mut change = Change::new(dir.read("domain: a\n"));
        assert!(change.observe(dir.read("domain: ")).is_none());
        assert!(change.observe(dir.read("domain: b\n")).is_none());
        assert!(change.observe(dir.read("domain: b\n")).is_some());
    }

    #[test]
    fn a_change_undone_before_the_second_look_is_not_loaded() {
        let dir = Dir::new();
        let mut change = Change::new(dir.read("domain: a\n"));
        assert!(change.observe(dir.read("domain: b\n")).is_none());
        assert!(change.observe(dir.read("domain: a\n")).is_none());
        assert!(change.observe(dir.read("domain: b\n")).is_none());
    }
}
