//! `/metrics`: the proxy's counters and latencies in Prometheus text.

use parking_lot::Mutex;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;

use crate::latency;

use super::State;
use super::wire::Format;

/// Routes counted apart in the metrics: each chat format's, and everything passed through.
#[derive(Debug, Clone, Copy)]
pub enum Route {
    Chat(Format),
    PassThrough,
}

/// How many routes are counted apart.
const ROUTES: usize = Format::ALL.len() + 1;

impl Route {
    /// Every route, in the counters' order.
    fn all() -> impl Iterator<Item = Self> {
        Format::ALL
            .iter()
            .map(|&format| Self::Chat(format))
            .chain(std::iter::once(Self::PassThrough))
    }

    /// The route's counter.
    fn index(self) -> usize {
        match self {
            Self::Chat(format) => format as usize,
            Self::PassThrough => ROUTES - 1,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::Chat(format) => format.wire().metric(),
            Self::PassThrough => "pass_through",
        }
    }
}

/// Counters and latency histograms of the serving process.
#[derive(Debug)]
pub struct Metrics {
    requests: [AtomicU64; ROUTES],
    /// Requests the proxy refused itself (bad input, no credential, limits).
    refused: AtomicU64,
    /// Requests forwarded untouched because the memory failed.
    memory_unavailable: AtomicU64,
    /// Requests the upstream could not serve (unreachable, timed out).
    upstream_failed: AtomicU64,
    /// Replies captured, and those captured truncated.
    replies: AtomicU64,
    truncated: AtomicU64,
    /// Capture + catch-up + recall, microseconds.
    memory_us: Mutex<Histogram<u64>>,
    /// Request in to the upstream's response headers, microseconds.
    first_byte_us: Mutex<Histogram<u64>>,
    /// Rows scored by recall's scans, and the time they took (for the scan's throughput).
    scanned_rows: AtomicU64,
    scan_us: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        let histogram = || Mutex::new(latency::histogram());
        Self {
            requests: Default::default(),
            refused: AtomicU64::new(0),
            memory_unavailable: AtomicU64::new(0),
            upstream_failed: AtomicU64::new(0),
            replies: AtomicU64::new(0),
            truncated: AtomicU64::new(0),
            memory_us: histogram(),
            first_byte_us: histogram(),
            scanned_rows: AtomicU64::new(0),
            scan_us: AtomicU64::new(0),
        }
    }
}

/// What a metric records.
#[derive(Debug, Clone, Copy)]
pub enum Event {
    Request(Route),
    Refused,
    MemoryUnavailable,
    UpstreamFailed,
    Reply { truncated: bool },
}

impl Metrics {
    pub fn count(&self, event: Event) {
        let counter = match event {
            Event::Request(route) => &self.requests[route.index()],
            Event::Refused => &self.refused,
            Event::MemoryUnavailable => &self.memory_unavailable,
            Event::UpstreamFailed => &self.upstream_failed,
            Event::Reply { truncated } => {
                if truncated {
                    self.truncated.fetch_add(1, Ordering::Relaxed);
                }
                &self.replies
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn memory_time(&self, elapsed: Duration) {
        record(&self.memory_us, elapsed);
    }

    pub fn first_byte(&self, elapsed: Duration) {
        record(&self.first_byte_us, elapsed);
    }

    pub fn scanned(&self, rows: usize, elapsed: Duration) {
        self.scanned_rows.fetch_add(rows as u64, Ordering::Relaxed);
        self.scan_us
            .fetch_add(elapsed.as_micros() as u64, Ordering::Relaxed);
    }
}

fn record(histogram: &Mutex<Histogram<u64>>, elapsed: Duration) {
    latency::record(&mut histogram.lock(), elapsed);
}

/// The Prometheus text exposition of `state`'s metrics.
pub fn render_metrics(state: &State) -> String {
    let m = &state.metrics;
    let mut out = String::new();
    let mut counter = |name: &str, help: &str, samples: &[(String, u64)]| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for (labels, value) in samples {
            let _ = writeln!(out, "{name}{labels} {value}");
        }
    };
    let requests: Vec<(String, u64)> = Route::all()
        .map(|r| {
            (
                format!("{{route=\"{}\"}}", r.label()),
                m.requests[r.index()].load(Ordering::Relaxed),
            )
        })
        .collect();
    counter("perpetuity_requests_total", "Requests by route.", &requests);
    for (name, help, value) in [
        (
            "perpetuity_refused_total",
            "Requests the proxy refused itself.",
            &m.refused,
        ),
        (
            "perpetuity_memory_unavailable_total",
            "Requests forwarded untouched because the memory failed.",
            &m.memory_unavailable,
        ),
        (
            "perpetuity_upstream_failed_total",
            "Requests the upstream could not serve.",
            &m.upstream_failed,
        ),
        (
            "perpetuity_replies_captured_total",
            "Replies captured.",
            &m.replies,
        ),
        (
            "perpetuity_replies_truncated_total",
            "Replies captured truncated.",
            &m.truncated,
        ),
        (
            "perpetuity_scanned_rows_total",
            "Rows in the scopes recall scanned.",
            &m.scanned_rows,
        ),
    ] {
        counter(
            name,
            help,
            &[(String::new(), value.load(Ordering::Relaxed))],
        );
    }
    for (name, help, value) in [
        (
            "perpetuity_storage_failures_total",
            "Storage failures met while serving (writes or arena growth refused).",
            state.health.failures(),
        ),
        (
            "perpetuity_storage_recoveries_total",
            "Times the server became ready again after a storage failure.",
            state.health.recoveries(),
        ),
    ] {
        counter(name, help, &[(String::new(), value)]);
    }
    for (name, help, histogram) in [
        (
            "perpetuity_memory_ms",
            "Capture, catch-up and recall per chat request.",
            &m.memory_us,
        ),
        (
            "perpetuity_upstream_first_byte_ms",
            "Request in to the upstream's response headers.",
            &m.first_byte_us,
        ),
    ] {
        let h = histogram.lock();
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} summary");
        for q in [0.5, 0.9, 0.99] {
            let _ = writeln!(out, "{name}{{quantile=\"{q}\"}} {:.3}", latency::ms(&h, q));
        }
        let _ = writeln!(out, "{name}_count {}", h.len());
    }
    let scan_s = m.scan_us.load(Ordering::Relaxed) as f64 / 1e6;
    let rows_per_s = if scan_s > 0.0 {
        m.scanned_rows.load(Ordering::Relaxed) as f64 / scan_s
    } else {
        0.0
    };
    let stats = state.engine.stats();
    for (name, help, value) in [
        (
            "perpetuity_ready",
            "1 while the memory takes writes, 0 while a storage failure lasts.",
            f64::from(u8::from(state.health.ready())),
        ),
        (
            "perpetuity_requests_in_flight",
            "Chat requests holding one of the max_concurrent slots (until their answer is relayed).",
            state.requests_in_flight() as f64,
        ),
        (
            "perpetuity_scan_rows_per_second",
            "Scan throughput of recall since start.",
            rows_per_s,
        ),
        (
            "perpetuity_stored_rows",
            "Next row id of the store (rows ever captured).",
            stats.next_row as f64,
        ),
        (
            "perpetuity_arena_rows",
            "Rows resident in the arena.",
            stats.arena_rows as f64,
        ),
        (
            "perpetuity_arena_bytes",
            "Bytes of the arena's files.",
            stats.arena_bytes as f64,
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
        );
    }
    out
}
