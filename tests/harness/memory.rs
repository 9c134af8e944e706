//! A memory limit a test controls, as a pod's: a cgroup (v1's `memory` controller or v2's)
//! whose processes the kernel kills when they pass it, with its peak and its kills readable.
//! Needs root.

use super::cgroup::Cgroup;

/// A cgroup with a memory limit; removed when dropped (after its processes have ended).
pub struct MemoryLimit(Cgroup);

impl MemoryLimit {
    /// A limit of `bytes`, or why this machine cannot set one.
    pub fn new(bytes: u64) -> Result<MemoryLimit, String> {
        let cgroup = Cgroup::new("memory", "memory.limit_in_bytes")?;
        // No swap to spill into, where the kernel lets the test say so.
        if cgroup.v2 {
            cgroup.write("memory.max", bytes)?;
            let _ = cgroup.write("memory.swap.max", 0);
        } else {
            cgroup.write("memory.limit_in_bytes", bytes)?;
            let _ = cgroup.write("memory.memsw.limit_in_bytes", bytes);
        }
        Ok(MemoryLimit(cgroup))
    }

    /// A prefix for [`super::Floodgate::start_wrapped`]: the process joins this cgroup, at
    /// nice level `nice`, then runs the binary.
    pub fn prefix(&self, nice: i32) -> Vec<String> {
        self.0.prefix(nice)
    }

    /// Processes the kernel killed for passing the limit so far.
    pub fn kills(&self) -> u64 {
        let file = if self.0.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        (self.0.read(file).lines())
            .find_map(|line| line.strip_prefix("oom_kill")?.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The most memory the cgroup has been charged so far (its processes' pages, the page
    /// cache they touched, and kernel memory for them), in bytes.
    pub fn peak(&self) -> u64 {
        let file = if self.0.v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        };
        self.0.read(file).trim().parse().unwrap_or(0)
    }
}
