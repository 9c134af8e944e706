//! A cgroup of a test's own under one controller (cgroup v1's hierarchy for it, or v2's
//! unified one), removed when dropped. Needs root.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// A new, empty cgroup.
pub struct Cgroup {
    pub dir: PathBuf,
    /// Whether it is cgroup v2's (its files have v2's names).
    pub v2: bool,
}

impl Cgroup {
    /// A cgroup under `controller` (`cpu`, `memory`), whose v1 hierarchy is known by its
    /// file `v1_file`; or why this machine cannot make one.
    pub fn new(controller: &str, v1_file: &str) -> Result<Cgroup, String> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err("cgroups need root".into());
        }
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "floodgate-test-{controller}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let v1 = Path::new("/sys/fs/cgroup").join(controller);
        let (root, v2) = if v1.join(v1_file).exists() {
            (v1, false)
        } else {
            let root = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
                .map(PathBuf::from)
                .into_iter()
                .find(|root| {
                    std::fs::read_to_string(root.join("cgroup.controllers"))
                        .is_ok_and(|listed| listed.split_whitespace().any(|c| c == controller))
                })
                .ok_or(format!("no cgroup {controller} controller here"))?;
            let _ = std::fs::write(
                root.join("cgroup.subtree_control"),
                format!("+{controller}"),
            );
            (root, true)
        };
        let dir = root.join(name);
        std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(Cgroup { dir, v2 })
    }

    /// Writes `text` to the cgroup's file `name`.
    pub fn write(&self, name: &str, text: impl ToString) -> Result<(), String> {
        let path = self.dir.join(name);
        std::fs::write(&path, text.to_string()).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The cgroup's file `name`, as text (empty when it cannot be read).
    pub fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(name)).unwrap_or_default()
    }

    /// A prefix for [`super::Floodgate::start_wrapped`]: the process joins this cgroup, at
    /// nice level `nice` (negative: before the machine's other work), then runs the binary.
    pub fn prefix(&self, nice: i32) -> Vec<String> {
        let script = format!(
            "echo $$ > {} && exec nice -n {nice} \"$@\"",
            self.dir.join("cgroup.procs").display()
        );
        vec!["sh".into(), "-c".into(), script, "sh".into()]
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // The processes in it may take a moment to be reaped.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}
