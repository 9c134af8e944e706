//! The process' own figures under the names every Prometheus client library gives them
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`, …), read from `/proc` when
//! the page is rendered, so dashboards built for other services show floodgate too. Nothing
//! is read on the request path. Linux only; elsewhere the family is left out.

use super::exposition::{Exposition, Kind};

/// What `/proc/self` says of this process.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Figures {
    cpu_seconds: f64,
    resident_bytes: u64,
    virtual_bytes: u64,
    start_time_seconds: f64,
    open_fds: u64,
    max_fds: u64,
}

/// Adds the process families; none where `/proc` cannot be read.
pub fn render(page: &mut Exposition) {
    let Some(figures) = read() else {
        return;
    };
    let families: [(&str, Kind, &str, f64); 6] = [
        (
            "process_cpu_seconds_total",
            Kind::Counter,
            "User and system CPU time spent, in seconds.",
            figures.cpu_seconds,
        ),
        (
            "process_resident_memory_bytes",
            Kind::Gauge,
            "Resident memory size, in bytes.",
            figures.resident_bytes as f64,
        ),
        (
            "process_virtual_memory_bytes",
            Kind::Gauge,
            "Virtual memory size, in bytes.",
            figures.virtual_bytes as f64,
        ),
        (
            "process_start_time_seconds",
            Kind::Gauge,
            "When the process started, in seconds since the Unix epoch.",
            figures.start_time_seconds,
        ),
        (
            "process_open_fds",
            Kind::Gauge,
            "Open file descriptors.",
            figures.open_fds as f64,
        ),
        (
            "process_max_fds",
            Kind::Gauge,
            "The most file descriptors the process may open (its soft limit).",
            figures.max_fds as f64,
        ),
    ];
    for (name, kind, help, value) in families {
        page.family(name, kind, help);
        page.sample(name, &[], value);
    }
}

#[cfg(target_os = "linux")]
fn read() -> Option<Figures> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let boot_time = (std::fs::read_to_string("/proc/stat").ok()?.lines())
        .find_map(|line| line.strip_prefix("btime ")?.trim().parse::<u64>().ok())?;
    // SAFETY: sysconf reads configuration constants; it has no preconditions.
    let (ticks, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let (ticks, page) = (u64::try_from(ticks).ok()?, u64::try_from(page).ok()?);
    let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the limit into the struct it is given, which lives here.
    let max_fds = match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } {
        0 => limit.rlim_cur,
        _ => return None,
    };
    parse_stat(&stat, ticks.max(1), page, boot_time).map(|mut figures| {
        figures.open_fds = open_fds;
        figures.max_fds = max_fds;
        figures
    })
}

#[cfg(not(target_os = "linux"))]
fn read() -> Option<Figures> {
    None
}

/// The figures in `/proc/self/stat`'s line: the fields after the command's closing
/// parenthesis (the command may hold spaces and parentheses itself), numbered as proc(5)
/// numbers them: utime 14, stime 15, starttime 22, vsize 23, rss 24 (in pages).
fn parse_stat(
    stat: &str,
    ticks_per_second: u64,
    page_bytes: u64,
    boot_time: u64,
) -> Option<Figures> {
    let after_command = &stat[stat.rfind(')')? + 1..];
    // Field 3 (the state) is the first after the command.
    let field = |number: usize| -> Option<u64> {
        after_command
            .split_whitespace()
            .nth(number - 3)?
            .parse()
            .ok()
    };
    let ticks = ticks_per_second as f64;
    Some(Figures {
        cpu_seconds: (field(14)? + field(15)?) as f64 / ticks,
        resident_bytes: field(24)?.saturating_mul(page_bytes),
        virtual_bytes: field(23)?,
        start_time_seconds: boot_time as f64 + field(22)? as f64 / ticks,
        open_fds: 0,
        max_fds: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stat_line_is_read_past_a_command_with_spaces_and_parentheses() {
        let stat = "4242 (flood gate (x)) S 1 4242 4242 0 -1 4194560 1200 0 0 0 250 50 0 0 20 0 \
                    9 0 500 104857600 2560 18446744073709551615";
        let figures = parse_stat(stat, 100, 4096, 1_700_000_000).expect("parsed");
        assert_eq!(figures.cpu_seconds, 3.0);
        assert_eq!(figures.virtual_bytes, 104_857_600);
        assert_eq!(figures.resident_bytes, 2560 * 4096);
        assert_eq!(figures.start_time_seconds, 1_700_000_005.0);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_reads_its_own_figures() {
        let figures = read().expect("/proc is readable on Linux");
        assert!(figures.resident_bytes > 0 && figures.open_fds > 0);
        assert!(figures.max_fds >= figures.open_fds);
    }
}
