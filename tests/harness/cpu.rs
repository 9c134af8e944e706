//! CPU a test controls, whatever else the machine runs: a cgroup that caps a process at a
//! share of one core (cgroup v1's `cpu` controller or v2's), and a priority above the
//! machine's other work, so the process gets exactly its share: no more, because of the
//! quota, and no less, because of the priority. Needs root.

use super::cgroup::Cgroup;

/// A cgroup with a CPU quota; removed when dropped (after the processes in it have ended).
pub struct CpuQuota(Cgroup);

impl CpuQuota {
    /// `percent` of one core every `period_us` µs, or why this machine cannot.
    pub fn new(percent: u32, period_us: u32) -> Result<CpuQuota, String> {
        let cgroup = Cgroup::new("cpu", "cpu.cfs_quota_us")?;
        // The kernel's smallest quota is 1 ms.
        let quota = (u64::from(period_us) * u64::from(percent) / 100).max(1000);
        if cgroup.v2 {
            cgroup.write("cpu.max", format!("{quota} {period_us}"))?;
        } else {
            cgroup.write("cpu.cfs_period_us", period_us)?;
            cgroup.write("cpu.cfs_quota_us", quota)?;
        }
        Ok(CpuQuota(cgroup))
    }

    /// A prefix for [`super::Floodgate::start_wrapped`]: the process joins this cgroup, at
    /// nice level `nice` (negative: before the machine's other work), then runs the binary.
    pub fn prefix(&self, nice: i32) -> Vec<String> {
        self.0.prefix(nice)
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
