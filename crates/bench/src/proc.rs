//! Process figures from /proc, for any server process (`--server-pid`) and for the
//! bench itself: CPU seconds (user + system) and resident memory. Linux only; on
//! other systems every reading is `None`.

/// One reading of a process.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcSample {
    pub cpu_secs: f64,
    pub rss_bytes: u64,
    /// Peak resident set since the process started (VmHWM).
    pub rss_peak_bytes: u64,
}

pub fn sample(pid: u32) -> Option<ProcSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(ProcSample {
        cpu_secs: cpu_secs(&stat)?,
        rss_bytes: status_kib(&status, "VmRSS")? * 1024,
        rss_peak_bytes: status_kib(&status, "VmHWM")? * 1024,
    })
}

pub fn sample_self() -> Option<ProcSample> {
    sample(std::process::id())
}

/// utime + stime from /proc/PID/stat. The command name (field 2) may hold spaces
/// and parentheses, so fields are counted from the last `)`.
fn cpu_secs(stat: &str) -> Option<f64> {
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / clock_ticks_per_sec())
}

fn clock_ticks_per_sec() -> f64 {
    // SAFETY: sysconf has no preconditions; it only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

fn status_kib(status: &str, key: &str) -> Option<u64> {
    status.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        rest.trim().trim_end_matches("kB").trim().parse().ok()
    })
}

/// The 1-minute load average, noted in every report (a busy machine skews results).
pub fn load_average() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_count_from_the_last_parenthesis() {
        let stat = "42 (a (weird) name) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 4 0";
        let t = clock_ticks_per_sec();
        assert_eq!(cpu_secs(stat), Some(300.0 / t));
    }

    #[test]
    fn status_values_are_kib() {
        let status = "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n";
        assert_eq!(status_kib(status, "VmRSS"), Some(1024));
        assert_eq!(status_kib(status, "VmHWM"), Some(2048));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_can_be_sampled() {
        let s = sample_self().expect("own /proc entry");
        assert!(s.rss_bytes > 0 && s.rss_peak_bytes >= s.rss_bytes);
    }
}
