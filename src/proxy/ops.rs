//! Operations: `/metrics` (Prometheus text) and the admin endpoints behind the admin token.

use parking_lot::{Mutex, RwLock};
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use hyper::HeaderMap;
use serde_json::json;

use crate::arena::{self, Arena};
use crate::backup;
use crate::integrity;
use crate::latency;
use crate::memory::Memory;
use crate::store::Purged;
use crate::swap;
use crate::types::UserId;

use super::{Generation, State};

/// Routes counted apart in the metrics.
#[derive(Debug, Clone, Copy)]
pub enum Route {
    OpenAiChat,
    OpenAiResponses,
    AnthropicMessages,
    GeminiGenerate,
    PassThrough,
}

impl Route {
    const ALL: [Self; 5] = [
        Self::OpenAiChat,
        Self::OpenAiResponses,
        Self::AnthropicMessages,
        Self::GeminiGenerate,
        Self::PassThrough,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::OpenAiChat => "openai_chat",
            Self::OpenAiResponses => "openai_responses",
            Self::AnthropicMessages => "anthropic_messages",
            Self::GeminiGenerate => "gemini_generate",
            Self::PassThrough => "pass_through",
        }
    }
}

/// Counters and latency histograms of the serving process.
#[derive(Debug)]
pub struct Metrics {
    requests: [AtomicU64; 5],
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
            Event::Request(route) => &self.requests[route as usize],
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
    let requests: Vec<(String, u64)> = Route::ALL
        .iter()
        .map(|r| {
            (
                format!("{{route=\"{}\"}}", r.label()),
                m.requests[*r as usize].load(Ordering::Relaxed),
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
    let generation = state.generation();
    let arena = generation.arena.read();
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
            generation.memory.store.next_row().0 as f64,
        ),
        (
            "perpetuity_arena_rows",
            "Rows resident in the arena.",
            arena.rows() as f64,
        ),
        (
            "perpetuity_arena_bytes",
            "Bytes of the arena's files.",
            arena.bytes() as f64,
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
        );
    }
    out
}

/// Whether `headers` carry the configured admin token (`Authorization: Bearer` or
/// `x-perpetuity-admin-token`), compared in constant time. No token configured: never.
pub fn is_admin(state: &State, headers: &HeaderMap) -> bool {
    let Some(token) = &state.config.admin_token else {
        return false;
    };
    let given = headers
        .get("x-perpetuity-admin-token")
        .or_else(|| headers.get(hyper::header::AUTHORIZATION))
        .and_then(|v| v.to_str().ok())
        .map(|v| v.strip_prefix("Bearer ").unwrap_or(v).trim())
        .unwrap_or("");
    token.matches(given)
}

/// `GET /admin/stats`.
pub fn stats(state: &State) -> serde_json::Value {
    let generation = state.generation();
    let arena = generation.arena.read();
    json!({
        "dictionary": generation.memory.dictionary.version(),
        "next_row": generation.memory.store.next_row().0,
        "arena_rows": arena.rows(),
        "arena_bytes": arena.bytes(),
        "arena_watermark": arena.watermark().0,
    })
}

/// `GET /admin/integrity`: every store invariant, and the serving arena against the store, with
/// writes held back meanwhile so the check sees one consistent state.
pub fn integrity(state: &State) -> Result<integrity::Report, crate::error::Error> {
    let _quiet = state.writes.write();
    let generation = state.generation();
    let memory = &generation.memory;
    let mut report = integrity::check(&memory.store, &memory.dictionary)?;
    if report.is_clean() {
        let mut arena = generation.arena.write();
        arena.catch_up(&memory.store, &memory.dictionary)?;
        integrity::check_arena(&memory.store, &arena, &mut report)?;
    }
    Ok(report)
}

/// `POST /admin/purge?user=KEY`: remove a user's memory, then rebuild the arena without it;
/// with `sub_users` (`?credential_user=KEY`, KEY a credential's own user) its sub-users' too.
/// Writes are held back meanwhile. Returns what was removed.
pub fn purge(
    state: &State,
    user_key: &str,
    sub_users: bool,
) -> Result<Purged, crate::error::Error> {
    let _quiet = state.writes.write();
    let generation = state.generation();
    let memory = &generation.memory;
    let user = UserId::from_key(user_key);
    let removed = if sub_users {
        memory.store.purge_credential(user)?
    } else {
        Purged {
            rows: memory.store.purge_user(user)?,
            sub_users: Vec::new(),
        }
    };
    for &purged in removed.sub_users.iter().chain([&user]) {
        state.turns.forget(purged);
    }
    state
        .recent
        .forget_users(&[&removed.sub_users[..], &[user]].concat());
    // A dark generation built before the purge holds the user's rows: drop it now where it is
    // not being built; one being built records the purge count it started at, and the flip
    // rebuilds it when that count has moved.
    if let Some(mut dark) = state.dark_arena.try_lock() {
        *dark = None;
    }
    let mut arena = generation.arena.write();
    arena::remove_all(memory.store.path())?;
    let (mut rebuilt, _) = Arena::open(&memory.store, &memory.dictionary)?;
    rebuilt.catch_up(&memory.store, &memory.dictionary)?;
    *arena = rebuilt;
    Ok(removed)
}

/// `POST /admin/backup?path=DEST`: a consistent backup of the serving memory into the new
/// folder DEST while captures go on (`crate::backup`). Returns its manifest.
pub fn backup(state: &State, to: &Path) -> Result<backup::Manifest, crate::error::Error> {
    let generation = state.generation();
    let manifest = backup::backup(&generation.memory, to)?;
    tracing::info!(
        to = %to.display(),
        rows_below = manifest.rows_below,
        elapsed_ms = manifest.elapsed_ms,
        "backup taken"
    );
    Ok(manifest)
}

/// `GET /admin/dictionary`: the data directory's dictionary versions and their states.
pub fn dictionaries(state: &State) -> Result<serde_json::Value, crate::error::Error> {
    let listed = swap::list(&state.generation().memory.store)?;
    Ok(json!({ "versions": listed }))
}

/// `POST /admin/dictionary/install?path=DIR`: upload and install the dictionary in `DIR` dark,
/// and start re-deriving every stored row under it in the background.
pub fn install(state: &Arc<State>, path: &Path) -> Result<serde_json::Value, crate::error::Error> {
    swap::install(&state.generation().memory.store, path)?;
    start_rederive(state);
    dictionaries(state)
}

/// How often a background re-derivation logs its progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// Re-derive the installed dark version's rows and build its arena generation on a thread of
/// its own and half the cores (progress logged after each batch), then leave the generation
/// for the flip.
pub fn start_rederive(state: &Arc<State>) {
    let state = Arc::clone(state);
    std::thread::spawn(move || {
        let mut slot = state.dark_arena.lock();
        let store = Arc::clone(&state.generation().memory.store);
        let Some(dictionary) = store.dark_dictionary() else {
            return;
        };
        let version = dictionary.version().to_owned();
        let started = Instant::now();
        let prepared = swap::background_pool().install(|| {
            let purges = store.purges()?;
            let mut logged = Instant::now();
            swap::rederive(&store, |progress| {
                if logged.elapsed() >= PROGRESS_EVERY || progress.is_derived() {
                    logged = Instant::now();
                    tracing::info!(
                        version,
                        done = progress.done,
                        total = progress.total,
                        "re-deriving the dark dictionary version"
                    );
                }
            })
            .and_then(|_| swap::build_arena(&store, &dictionary))
            .map(|arena| (arena, purges))
        });
        match prepared {
            Ok((arena, purges)) => {
                tracing::info!(
                    version,
                    rows = arena.rows(),
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "dark dictionary version ready to flip"
                );
                *slot = Some((arena, purges));
            }
            Err(err) => tracing::error!(version, %err, "re-deriving the dark version failed"),
        }
    });
}

/// `POST /admin/dictionary/flip?version=V`: make the ready dark version `V` serve. Its arena
/// generation is caught up first, then, with writes held back, caught up to the last capture,
/// the store flipped, and the serving generation swapped whole; requests in flight finish on
/// the old one. Returns the versions and the time writes were held back.
pub fn flip(state: &State, version: &str) -> Result<serde_json::Value, crate::error::Error> {
    let store = Arc::clone(&state.generation().memory.store);
    let refused = |reason: String| crate::store::StoreError::Swap {
        path: store.path().to_path_buf(),
        reason,
    };
    let Some(mut slot) = state.dark_arena.try_lock() else {
        return Err(refused(format!("{version} is still being derived")).into());
    };
    let dictionary = store
        .dark_dictionary()
        .filter(|d| d.version() == version)
        .ok_or_else(|| refused(format!("{version} is not the installed dark version")))?;
    let (mut arena, mut built_at) = match slot.take() {
        Some(built) => built,
        // Not built yet: the job has not started (or a purge dropped what it built). Only a
        // fully derived version can be built here; otherwise the job is still to run.
        None => match store.dark()? {
            Some(dark) if dark.is_derived() => {
                (swap::build_arena(&store, &dictionary)?, store.purges()?)
            }
            Some(dark) => {
                return Err(refused(format!(
                    "{version} is still being derived ({}/{} rows)",
                    dark.done, dark.total
                ))
                .into());
            }
            None => return Err(refused(format!("{version} is not installed")).into()),
        },
    };
    arena.catch_up(&store, &dictionary)?;
    let started = Instant::now();
    let _quiet = state.writes.write();
    // A purge since the build left the purged user's rows in it: build it again from the store
    // (no purge can run now).
    if store.purges()? != built_at {
        arena::remove_version(store.path(), version)?;
        (arena, built_at) = (swap::build_arena(&store, &dictionary)?, store.purges()?);
        tracing::info!(
            version,
            built_at,
            "a purge ran during the build: rebuilt the dark arena"
        );
    }
    let retired = swap::flip(&store, &dictionary, &mut arena)?;
    *state.serving.write() = Arc::new(Generation {
        memory: Memory { store, dictionary },
        arena: RwLock::new(arena),
    });
    let held = started.elapsed();
    tracing::info!(
        serving = version,
        retired,
        held_ms = held.as_secs_f64() * 1e3,
        "dictionary flipped"
    );
    Ok(json!({
        "serving": version,
        "retired": retired,
        "flip_ms": held.as_secs_f64() * 1e3,
    }))
}
