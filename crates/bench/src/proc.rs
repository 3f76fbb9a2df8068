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

/// The whole machine's CPU time so far, from the first line of /proc/stat (all CPUs,
/// in clock ticks).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MachineTicks {
    /// Idle, including time idle while waiting for I/O.
    pub idle: u64,
    /// Time the hypervisor ran something else while this machine wanted a CPU.
    pub steal: u64,
    pub total: u64,
}

impl MachineTicks {
    /// Shares of all CPU time from `self` to `later` that were idle and stolen.
    pub fn shares_until(&self, later: &MachineTicks) -> Option<(f64, f64)> {
        let total = later.total.checked_sub(self.total).filter(|&t| t > 0)? as f64;
        let idle = later.idle.saturating_sub(self.idle) as f64;
        let steal = later.steal.saturating_sub(self.steal) as f64;
        Some((idle / total, steal / total))
    }
}

pub fn machine_ticks() -> Option<MachineTicks> {
    parse_machine_ticks(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// `cpu  user nice system idle iowait irq softirq steal guest guest_nice`; guest
/// time is already counted in user and nice, so it is left out of the total.
fn parse_machine_ticks(stat: &str) -> Option<MachineTicks> {
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let f: Vec<u64> = line
        .split_whitespace()
        .take(8)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    if f.len() < 8 {
        return None;
    }
    Some(MachineTicks {
        idle: f[3] + f[4],
        steal: f[7],
        total: f.iter().sum(),
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

    #[test]
    fn machine_ticks_come_from_the_first_line() {
        let stat = "cpu  100 5 50 800 40 0 5 0 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n";
        let t = parse_machine_ticks(stat).unwrap();
        assert_eq!(
            t,
            MachineTicks {
                idle: 840,
                steal: 0,
                total: 1000
            }
        );
        let later = parse_machine_ticks("cpu  250 5 100 1100 40 0 5 100 0 0\n").unwrap();
        let (idle, steal) = t.shares_until(&later).unwrap();
        assert!((idle - 0.5).abs() < 1e-9 && (steal - 100.0 / 600.0).abs() < 1e-9);
        assert_eq!(later.shares_until(&t), None, "time runs forwards only");
        assert_eq!(parse_machine_ticks("intr 1 2 3\n"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_can_be_sampled() {
        let s = sample_self().expect("own /proc entry");
        assert!(s.rss_bytes > 0 && s.rss_peak_bytes >= s.rss_bytes);
    }
}
