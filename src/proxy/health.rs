//! Readiness: whether the memory takes writes.
//!
//! A storage failure while serving (a capture, a reply, a tool call, a reheat or an arena
//! catch-up that the disk refused: full, or failing) makes the server not ready: `/healthz`
//! answers 503 with the reason, and chat requests are forwarded untouched (the harness's own
//! messages) with `x-perpetuity-memory: unavailable`, nothing of them stored. Every
//! [`PROBE_INTERVAL`] a probe tries one small real write and an arena catch-up; when both
//! succeed the server is ready again, with no restart. `docs/reliability.md` has the details.

use parking_lot::Mutex;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error::Error;

use super::State;

/// How often a server that is not ready tries a write again. RocksDB itself checks for free
/// space every 5 s after a full disk, so a shorter interval finds it resumed within 2 s.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(2);

/// Why the server is not ready, and since when.
#[derive(Debug, Clone)]
pub struct Outage {
    pub reason: String,
    pub since: Instant,
}

/// The readiness state and its counters.
#[derive(Debug, Default)]
pub struct Health {
    outage: Mutex<Option<Outage>>,
    /// Storage failures met while serving (the probe's own not counted).
    failures: AtomicU64,
    /// Times the server became ready again.
    recoveries: AtomicU64,
}

impl Health {
    /// Whether the memory takes writes (no storage failure since the last successful probe).
    pub fn ready(&self) -> bool {
        self.outage().is_none()
    }

    /// The current outage, if the server is not ready.
    pub fn outage(&self) -> Option<Outage> {
        self.outage.lock().clone()
    }

    /// Note an error met while `doing` something: a storage failure makes the server not ready
    /// (logged once, when it stops being ready); any other error is the request's alone.
    pub fn report(&self, doing: &str, err: &Error) {
        if !err.is_storage_failure() {
            return;
        }
        self.failures.fetch_add(1, Ordering::Relaxed);
        let mut outage = self.outage.lock();
        if outage.is_none() {
            tracing::error!(%err, doing, "storage failure: not ready; requests pass through untouched until a write succeeds again");
            *outage = Some(Outage {
                reason: format!("{doing} failed: {err}"),
                since: Instant::now(),
            });
        }
    }

    /// Storage failures met while serving.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Times the server became ready again.
    pub fn recoveries(&self) -> u64 {
        self.recoveries.load(Ordering::Relaxed)
    }

    fn recovered(&self) {
        if let Some(outage) = self.outage.lock().take() {
            self.recoveries.fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                after_ms = outage.since.elapsed().as_millis() as u64,
                "the store takes writes again: ready"
            );
        }
    }
}

/// Probe the storage every [`PROBE_INTERVAL`] while the server is not ready, and mark it ready
/// when a probe succeeds. Runs as long as the server does.
pub async fn watch(state: Arc<State>) -> Infallible {
    loop {
        tokio::time::sleep(PROBE_INTERVAL).await;
        if state.health.ready() {
            continue;
        }
        let probed = {
            let state = Arc::clone(&state);
            tokio::task::spawn_blocking(move || state.engine.probe()).await
        };
        match probed {
            Ok(Ok(())) => state.health.recovered(),
            Ok(Err(err)) => tracing::debug!(%err, "probe: the storage still fails"),
            Err(err) => tracing::warn!(%err, "the probe task failed"),
        }
    }
}
