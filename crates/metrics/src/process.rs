//! The process's own series, under the names every Prometheus exporter uses
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`, ...), read from
//! `/proc` at each scrape, so the usual dashboards and alerts (memory growth, fd
//! exhaustion, restarts) work on Steadfast's processes as on any other. Elsewhere than
//! Linux there is no `/proc` and the series are left out.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Reads `/proc/self` when scraped.
#[derive(Debug, Default)]
pub(crate) struct ProcessCollector;

/// What `/proc/self/stat` and friends say now.
struct Sample {
    cpu_seconds: f64,
    resident_bytes: i64,
    virtual_bytes: i64,
    start_time_seconds: i64,
    threads: i64,
    open_fds: i64,
    max_fds: Option<i64>,
}

fn sample() -> Option<Sample> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count fields
    // after its closing one. Fields from 3 on, 1-based as in proc(5).
    let rest: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let field = |n: usize| rest.get(n - 3).and_then(|v| v.parse::<i64>().ok());
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .unwrap_or(4096);
    let boot = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse::<i64>().ok())?;
    let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as i64;
    let max_fds = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|limits| {
            limits
                .lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3))
                .and_then(|v| v.parse().ok())
        });
    Some(Sample {
        cpu_seconds: (field(14)? + field(15)?) as f64 / ticks,
        resident_bytes: field(24)? * page,
        virtual_bytes: field(23)?,
        start_time_seconds: boot + (field(22)? as f64 / ticks) as i64,
        threads: field(20)?,
        open_fds,
        max_fds,
    })
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(s) = sample() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(s.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "User and system CPU time spent, in seconds",
            None,
            cpu.metric_type(),
        )?)?;
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size, in bytes",
                Some(s.resident_bytes),
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size, in bytes",
                Some(s.virtual_bytes),
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch, in seconds",
                Some(s.start_time_seconds),
            ),
            ("process_threads", "Threads of the process", Some(s.threads)),
            (
                "process_open_fds",
                "Open file descriptors",
                Some(s.open_fds),
            ),
            (
                "process_max_fds",
                "The most file descriptors the process may open",
                s.max_fds,
            ),
        ];
        for (name, help, value) in gauges {
            let Some(value) = value else { continue };
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}
