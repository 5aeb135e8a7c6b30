//! CPU times and parent ids of processes from `/proc/PID/stat` (Linux), for the benches.

/// CPU time (clock ticks, user + system) of `pid` alone; 0 when it is gone.
pub(crate) fn cpu_ticks(pid: u32) -> u64 {
    stat_field(pid, 11).unwrap_or(0) + stat_field(pid, 12).unwrap_or(0)
}

/// Field `n` (0 = state) after the command name of /proc/PID/stat: 1 = ppid, 11 = utime,
/// 12 = stime (proc(5)).
pub(crate) fn stat_field(pid: u32, n: usize) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    rest.split(' ').nth(n)?.parse().ok()
}

/// Clock ticks per second for `/proc` CPU times (USER_HZ, 100 on Linux).
pub(crate) const TICKS_PER_S: f64 = 100.0;
