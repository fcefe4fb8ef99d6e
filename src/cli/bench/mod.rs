//! `perpetuity bench`: the benchmarks that print figures; the memory's (ingest, backup, scan,
//! fidelity) in `store`, those through the proxy (proxy, prefix, bodies) in `serving`.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Subcommand;

use perpetuity::datasets::{self, Format};
use perpetuity::engine::Engine;
use perpetuity::ingest::{self};
use perpetuity::measure;
use perpetuity::memory::Memory;
use perpetuity::proxy;
use perpetuity::scan::kernels::{Ceiling, Kernels};
use perpetuity::store::Store;
use perpetuity::types::{RowId, UserId};

use super::*;

mod serving;
mod store;

use serving::{bench_bodies, bench_prefix, bench_proxy};
use store::{bench_backup, bench_fidelity, bench_ingest, bench_scan};

pub fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Scan {
            rows,
            users,
            threads,
            queries,
            fidelity_queries,
            kernels,
            during_rederive,
            json,
            data,
            dictionary,
        } => bench_scan(
            measure::ScanSettings {
                rows,
                users,
                threads,
                queries,
                fidelity_queries,
            },
            Kernels::detect(kernels),
            data,
            json,
            during_rederive,
            &dictionary,
        ),
        BenchCommand::Fidelity {
            locomo,
            rows,
            users,
            queries,
            kernels,
            data,
            json,
            dictionary,
        } => bench_fidelity(
            locomo.as_deref(),
            Kernels::detect(kernels),
            measure::ScanSettings {
                rows,
                users,
                threads: rayon::current_num_threads(),
                queries,
                fidelity_queries: queries,
            },
            data,
            json,
            &dictionary,
        ),
        BenchCommand::Ingest {
            messages,
            users,
            data,
            sync,
            dictionary,
        } => bench_ingest(messages, users, data, sync, &dictionary),
        BenchCommand::Backup {
            rows,
            users,
            writers,
            seconds,
            json,
            data,
            dictionary,
        } => bench_backup(rows, users, writers, seconds, json, data, &dictionary),
        BenchCommand::Proxy {
            rows,
            users,
            concurrency,
            requests,
            first_byte_ms,
            hostile,
            data,
            json,
            dictionary,
        } => bench_proxy(
            rows,
            proxy::load::Calls {
                users,
                concurrency,
                requests,
            },
            (first_byte_ms, hostile),
            data,
            json,
            &dictionary,
        ),
        BenchCommand::Prefix {
            turns,
            steps,
            json,
            dictionary,
        } => bench_prefix(turns, steps, json, &dictionary),
        BenchCommand::Bodies {
            concurrent,
            mib,
            json,
            dictionary,
        } => bench_bodies(concurrent, mib, json, &dictionary),
    }
}

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Scan throughput, query latency and two-stage fidelity over a synthetic pooled memory.
    Scan {
        /// Rows in the memory.
        #[arg(long, default_value_t = 100_000)]
        rows: usize,
        /// Users they are spread over (1: one scope holds every row, the worst case).
        #[arg(long, default_value_t = 1)]
        users: usize,
        /// Threads a query is spread over.
        #[arg(long, default_value_t = 2)]
        threads: usize,
        /// Queries timed.
        #[arg(long, default_value_t = 200)]
        queries: usize,
        /// Queries also answered by brute force to measure fidelity.
        #[arg(long, default_value_t = 20)]
        fidelity_queries: usize,
        /// The widest scan kernels allowed (`avx2`: those an AVX2-only CPU runs).
        #[arg(long, value_enum, default_value_t = Ceiling::Native)]
        kernels: Ceiling,
        /// Re-derive the store's installed dark dictionary version on a thread of its own
        /// while the benchmark runs (the queries' latency during a hot swap); its rate on
        /// stderr.
        #[arg(long)]
        during_rederive: bool,
        /// Print one JSON object (names in docs/journal/benchmarks.md).
        #[arg(long)]
        json: bool,
        /// Where to put the store (default: a fresh temp folder, removed afterwards); a store
        /// that already holds rows is reused as it is.
        #[arg(long)]
        data: Option<PathBuf>,
        #[command(flatten)]
        dictionary: DictionaryArgs,
    },
    /// Top-10 agreement of the two-stage search with brute force (the same exact scorer over
    /// every row): LoCoMo questions, each in its user's scope and in the scope of every
    /// conversation pooled, and seeded synthetic queries over a synthetic pool.
    Fidelity {
        /// A LoCoMo file (e.g. locomo10.json) whose questions are asked; none: skipped.
        #[arg(long)]
        locomo: Option<PathBuf>,
        /// Rows of the synthetic pool (0: skipped).
        #[arg(long, default_value_t = 1_000_000)]
        rows: usize,
        /// Users the synthetic rows are spread over (1: one scope holds every row).
        #[arg(long, default_value_t = 1)]
        users: usize,
        /// Synthetic queries asked.
        #[arg(long, default_value_t = 200)]
        queries: usize,
        /// The widest scan kernels allowed (`avx2`: those an AVX2-only CPU runs).
        #[arg(long, value_enum, default_value_t = Ceiling::Native)]
        kernels: Ceiling,
        /// Where to put the synthetic store (default: a fresh temp folder, removed afterwards);
        /// a store that already holds rows is reused as it is.
        #[arg(long)]
        data: Option<PathBuf>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        dictionary: DictionaryArgs,
    },
    /// A backup taken while threads keep capturing: its time, the capture latency before and
    /// during it, and the time to restore it (files only).
    Backup {
        /// Rows in the memory (made once, then reused with `--data`).
        #[arg(long, default_value_t = 100_000)]
        rows: usize,
        /// Users they are spread over.
        #[arg(long, default_value_t = 1_000)]
        users: usize,
        /// Threads capturing one message at a time meanwhile.
        #[arg(long, default_value_t = 2)]
        writers: usize,
        /// Capture this long before the backup, and at least this long from its start.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        /// Where to put the store (default: a fresh temp folder, removed afterwards); a store
        /// that already holds rows is reused (it grows by the captures). The backup and the
        /// restored folder are made beside it and removed afterwards.
        #[arg(long)]
        data: Option<PathBuf>,
        #[command(flatten)]
        dictionary: DictionaryArgs,
    },
    /// Capture rate (rows/s) into a fresh store with the WAL on.
    Ingest {
        /// Messages to capture.
        #[arg(long, default_value_t = 200_000)]
        messages: usize,
        /// Users they are spread over.
        #[arg(long, default_value_t = 100)]
        users: usize,
        /// Where to put the store (default: a fresh folder under the system temp dir, removed
        /// afterwards).
        #[arg(long)]
        data: Option<PathBuf>,
        /// fsync the WAL on every batch.
        #[arg(long)]
        sync: bool,
        #[command(flatten)]
        dictionary: DictionaryArgs,
    },
    /// What the proxy adds to a streamed call against a local upstream: time to first byte and
    /// total, direct, through the proxy, and with recall off.
    Proxy {
        /// Rows the store holds, pooled over `--users` (one user, one scope: the worst case).
        #[arg(long, default_value_t = 0)]
        rows: usize,
        /// Users (credentials) the rows are spread over; the requests take turns among them.
        #[arg(long, default_value_t = 1)]
        users: usize,
        /// Requests in flight at once.
        #[arg(long, default_value_t = 1)]
        concurrency: usize,
        /// Requests per way of calling.
        #[arg(long, default_value_t = 500)]
        requests: usize,
        /// The local upstream's time to first byte, in milliseconds, as a model's (hundreds for
        /// a real provider); 0 answers at once, which leaves the proxy's work nothing to
        /// overlap.
        #[arg(long, default_value_t = 0)]
        first_byte_ms: u64,
        /// Measure instead the first user's calls, one at a time, unloaded and while each
        /// hostile request of the security review runs (`proxy::hostile`).
        #[arg(long)]
        hostile: bool,
        /// Where to put the store (reused when it already holds the benchmark user's rows).
        #[arg(long)]
        data: Option<PathBuf>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        dictionary: DictionaryArgs,
    },
    /// Peak resident memory while large request bodies (many tiny messages, the worst case
    /// for a parsed JSON tree) pass through the proxy at once, against the bodies' size.
    Bodies {
        /// Bodies in flight at once.
        #[arg(long, default_value_t = 8)]
        concurrent: usize,
        /// Size of each body, in MiB.
        #[arg(long, default_value_t = 30)]
        mib: usize,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        dictionary: DictionaryArgs,
    },
    /// The share of each forwarded request that is a common prefix with the conversation's
    /// previous one (what a provider's prompt cache can serve), over a scripted agent session
    /// in Claude Code's shape: as the client sent it (a direct call) and through the proxy.
    Prefix {
        /// Turns of the session.
        #[arg(long, default_value_t = 6)]
        turns: usize,
        /// Tool steps per turn (each one more request).
        #[arg(long, default_value_t = 5)]
        steps: usize,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        dictionary: DictionaryArgs,
    },
}

/// A store for a benchmark: `data`, or a fresh folder under the system temp dir that is
/// removed when the returned guard drops.
struct BenchDir {
    dir: PathBuf,
    temporary: bool,
}

/// Whether a benchmark may run on a store that already exists.
#[derive(PartialEq)]
enum Existing {
    Refuse,
    Reuse,
}

impl BenchDir {
    fn new(data: Option<PathBuf>, name: &str, existing: Existing) -> anyhow::Result<Self> {
        let (dir, temporary) = match data {
            Some(dir) => (dir, false),
            None => (
                std::env::temp_dir()
                    .join(format!("perpetuity-bench-{name}-{}", std::process::id())),
                true,
            ),
        };
        anyhow::ensure!(
            existing == Existing::Reuse || !dir.exists(),
            "{} exists; the benchmark writes a fresh store",
            dir.display()
        );
        Ok(Self { dir, temporary })
    }
}

impl Drop for BenchDir {
    fn drop(&mut self) {
        if self.temporary
            && let Err(err) = std::fs::remove_dir_all(&self.dir)
        {
            eprintln!("could not remove {}: {err}", self.dir.display());
        }
    }
}

/// A store holding the seeded synthetic pool of `settings` (ingested unless `data` already
/// holds rows), with the guard that removes a temporary one.
fn synthetic_memory(
    data: Option<PathBuf>,
    settings: measure::ScanSettings,
    dictionary: &DictionaryArgs,
    name: &'static str,
) -> anyhow::Result<(BenchDir, Memory)> {
    let place = BenchDir::new(data, name, Existing::Reuse)?;
    let memory = dictionary.open(&DataArgs {
        dir: place.dir.clone(),
        sync_writes: false,
        uncompressed: false,
    })?;
    if memory.store.rows_since(RowId(0)).next().is_none() {
        let input =
            measure::synthetic_messages(settings.rows, settings.users, measure::MESSAGE_SEED);
        ingest::ingest(
            &memory.store,
            &memory.dictionary,
            &input,
            progress_printer(name),
        )?;
    } else {
        eprintln!(
            "bench {name}: {} already holds rows; reusing them (--rows is ignored; --users must match the store)",
            place.dir.display()
        );
    }
    Ok((place, memory))
}
