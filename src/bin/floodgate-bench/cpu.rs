//! CPU time of the processes a run watches, from `/proc/<pid>/stat`: what each decision
//! cost the server, Redis and the load generator (it shares the machine with them).

use anyhow::Context;

/// Whose CPU time a figure is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Process {
    Server,
    /// Every Redis process given, summed.
    Redis,
    LoadGen,
}

impl Process {
    pub fn label(self) -> &'static str {
        match self {
            Process::Server => "server",
            Process::Redis => "redis",
            Process::LoadGen => "load gen",
        }
    }
}

/// The processes whose CPU time a run reports: the server and Redis when their pids are
/// given, and always the load generator itself.
pub struct Watched(Vec<(Process, Vec<u32>)>);

impl Watched {
    pub fn new(server_pid: Option<u32>, redis_pids: &[u32]) -> Self {
        let mut watched = Vec::new();
        if let Some(pid) = server_pid {
            watched.push((Process::Server, vec![pid]));
        }
        if !redis_pids.is_empty() {
            watched.push((Process::Redis, redis_pids.to_vec()));
        }
        watched.push((Process::LoadGen, vec![std::process::id()]));
        Watched(watched)
    }

    /// CPU seconds so far of each watched entry (its processes summed).
    pub fn cpu_seconds(&self) -> anyhow::Result<Vec<(Process, f64)>> {
        self.0
            .iter()
            .map(|(who, pids)| {
                let seconds = pids
                    .iter()
                    .map(|&pid| process_cpu_seconds(pid))
                    .sum::<anyhow::Result<f64>>()?;
                Ok((*who, seconds))
            })
            .collect()
    }
}

/// The CPU seconds spent between two readings of the same [`Watched`].
pub fn spent(before: &[(Process, f64)], after: &[(Process, f64)]) -> Vec<(Process, f64)> {
    after
        .iter()
        .zip(before)
        .map(|(&(who, after), &(_, before))| (who, after - before))
        .collect()
}

/// User + system CPU seconds of a process, all threads, from `/proc/<pid>/stat` (in
/// USER_HZ = 100 ticks per second, fixed by the Linux ABI).
fn process_cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // The command name (field 2) may hold spaces; count fields after its closing ')'.
    let after_name = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("unexpected /proc stat format")?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Fields 14 and 15 overall are utime and stime: 12th and 13th after the name.
    let ticks = |i: usize| -> anyhow::Result<f64> {
        Ok(fields
            .get(i)
            .context("short /proc stat")?
            .parse::<u64>()
            .context("bad /proc stat field")? as f64)
    };
    Ok((ticks(11)? + ticks(12)?) / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_cpu_time_is_readable() {
        let cpu = process_cpu_seconds(std::process::id()).unwrap();
        assert!(cpu >= 0.0);
    }

    #[test]
    fn the_load_generator_is_always_watched_last() {
        let watched = Watched::new(Some(std::process::id()), &[]);
        let who: Vec<_> = watched
            .cpu_seconds()
            .unwrap()
            .into_iter()
            .map(|(who, _)| who)
            .collect();
        assert_eq!(who, [Process::Server, Process::LoadGen]);
    }

    #[test]
    fn spent_is_the_difference_per_process() {
        let before = [(Process::Server, 1.5), (Process::LoadGen, 0.25)];
        let after = [(Process::Server, 2.0), (Process::LoadGen, 1.0)];
        assert_eq!(
            spent(&before, &after),
            [(Process::Server, 0.5), (Process::LoadGen, 0.75)]
        );
    }
}
