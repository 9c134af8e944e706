//! CPU a test controls, whatever else the machine runs: a cgroup that caps a process at a
//! share of one core (cgroup v1's `cpu` controller or v2's), and a priority above the
//! machine's other work, so the process gets exactly its share: no more, because of the
//! quota, and no less, because of the priority. Needs root.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

/// A cgroup with a CPU quota; removed when dropped (after the processes in it have ended).
pub struct CpuQuota {
    dir: PathBuf,
    procs: PathBuf,
}

impl CpuQuota {
    /// `percent` of one core every `period_us` µs, or why this machine cannot.
    pub fn new(percent: u32, period_us: u32) -> Result<CpuQuota, String> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err("cgroups need root".into());
        }
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "floodgate-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        // The kernel's smallest quota is 1 ms.
        let quota = (u64::from(period_us) * u64::from(percent) / 100).max(1000);
        let v1 = PathBuf::from("/sys/fs/cgroup/cpu");
        let write = |path: PathBuf, text: String| {
            std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
        };
        if v1.join("cpu.cfs_quota_us").exists() {
            let dir = v1.join(name);
            std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let cgroup = CpuQuota {
                procs: dir.join("cgroup.procs"),
                dir,
            };
            write(cgroup.dir.join("cpu.cfs_period_us"), period_us.to_string())?;
            write(cgroup.dir.join("cpu.cfs_quota_us"), quota.to_string())?;
            return Ok(cgroup);
        }
        let root = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
            .map(PathBuf::from)
            .into_iter()
            .find(|root| {
                std::fs::read_to_string(root.join("cgroup.controllers"))
                    .is_ok_and(|controllers| controllers.split_whitespace().any(|c| c == "cpu"))
            })
            .ok_or("no cgroup cpu controller here")?;
        let _ = std::fs::write(root.join("cgroup.subtree_control"), "+cpu");
        let dir = root.join(name);
        std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let cgroup = CpuQuota {
            procs: dir.join("cgroup.procs"),
            dir,
        };
        write(cgroup.dir.join("cpu.max"), format!("{quota} {period_us}"))?;
        Ok(cgroup)
    }

    /// A prefix for [`super::Floodgate::start_wrapped`]: the process joins this cgroup, at
    /// nice level `nice` (negative: before the machine's other work), then runs the binary.
    pub fn prefix(&self, nice: i32) -> Vec<String> {
        let script = format!(
            "echo $$ > {} && exec nice -n {nice} \"$@\"",
            self.procs.display()
        );
        vec!["sh".into(), "-c".into(), script, "sh".into()]
    }
}

impl Drop for CpuQuota {
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

/// The nice level of a test's own parts (its servers, Redis, its relays and clients) where
/// their timing is what the test checks: above the machine's other work, so a busy machine
/// does not starve them (a test never depends on the CPU being idle).
pub const URGENT: i32 = -10;

/// A prefix for [`super::Floodgate::start_wrapped`] that runs the server at [`URGENT`].
pub const URGENT_PREFIX: [&str; 3] = ["nice", "-n", "-10"];

/// Puts every thread of this test process at [`URGENT`] (threads started later inherit it
/// from the thread that starts them): the test's relays and clients keep their timing on a
/// busy machine. Without root it leaves them as they are.
pub fn make_this_process_urgent() {
    let Ok(threads) = std::fs::read_dir("/proc/self/task") else {
        return;
    };
    for thread in threads.flatten() {
        if let Some(tid) = thread
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<u32>().ok())
        {
            // SAFETY: setpriority has no memory preconditions; a failure (no root) is ignored.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, URGENT) };
        }
    }
}
