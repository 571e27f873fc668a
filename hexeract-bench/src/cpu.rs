//! Processor time, read from `/proc`: this process's, and a local broker's, so that a line can
//! say what each side spent per message where both run on this machine.

use std::time::Duration;

/// User and system time this process has used so far; zero where there is no `/proc`.
pub(crate) fn this_process() -> Duration {
    std::fs::read_to_string("/proc/self/stat")
        .map(|stat| used(&stat))
        .unwrap_or(Duration::ZERO)
}

/// User and system time used so far by every process whose command is `command` (RabbitMQ's
/// `beam.smp`); zero where none runs here.
pub(crate) fn processes_named(command: &str) -> Duration {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Duration::ZERO;
    };
    entries
        .flatten()
        .filter(|entry| {
            std::fs::read_to_string(entry.path().join("comm"))
                .is_ok_and(|comm| comm.trim_end() == command)
        })
        .filter_map(|entry| std::fs::read_to_string(entry.path().join("stat")).ok())
        .map(|stat| used(&stat))
        .sum()
}

/// utime and stime of a `/proc/<pid>/stat` line, in clock ticks of 10 ms: the 12th and 13th
/// fields after the command name, which is in parentheses.
fn used(stat: &str) -> Duration {
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: u64 = after_name
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|field| field.parse::<u64>().ok())
        .sum();
    Duration::from_millis(ticks * 10)
}

/// Processor time per message, in microseconds.
pub(crate) fn per_message(used: Duration, messages: u64) -> f64 {
    used.as_secs_f64() * 1e6 / messages.max(1) as f64
}
