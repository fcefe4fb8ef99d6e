//! `perpetuity bench`: the benchmarks that print figures.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use clap::Subcommand;

use perpetuity::datasets::{self, Format};
use perpetuity::engine::Engine;
use perpetuity::ingest::{self};
use perpetuity::measure;
use perpetuity::memory::Memory;
use perpetuity::proxy;
use perpetuity::scan::kernels::Kernels;
use perpetuity::store::Store;
use perpetuity::types::{RowId, UserId};

use super::*;

pub fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Scan {
            rows,
            users,
            threads,
            queries,
            fidelity_queries,
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
            data,
            json,
            dictionary,
        } => bench_fidelity(
            locomo.as_deref(),
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

/// A proxy's state over the fresh store in `place`.
fn fresh_state(
    place: &BenchDir,
    dictionary: &DictionaryArgs,
    config: proxy::ProxyConfig,
) -> anyhow::Result<Arc<proxy::State>> {
    let memory = dictionary.open(&DataArgs {
        dir: place.dir.clone(),
        sync_writes: false,
        uncompressed: false,
    })?;
    let secret = proxy::identity::Secret::load_or_create(&place.dir)?;
    let (engine, _, _) = Engine::open(memory, Kernels::detect(false))?;
    Ok(Arc::new(proxy::State::new(engine, secret, config)))
}

/// `perpetuity bench bodies`: peak resident memory while large bodies pass through a proxy
/// over a fresh store (`proxy::load::bodies`).
fn bench_bodies(
    concurrent: usize,
    mib: usize,
    json: bool,
    dictionary: &DictionaryArgs,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        concurrent >= 1 && mib >= 1,
        "--concurrent and --mib must be at least 1"
    );
    let place = BenchDir::new(None, "bodies", Existing::Refuse)?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let report = runtime.block_on(async {
        let upstream = proxy::load::local_upstream().await?;
        let config = proxy::ProxyConfig {
            openai: format!("http://{upstream}"),
            body_limit: (mib + 1) << 20,
            ..proxy::ProxyConfig::default()
        };
        let state = fresh_state(&place, dictionary, config)?;
        anyhow::Ok(proxy::load::bodies(state, concurrent, mib << 20).await?)
    })?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "bench bodies: {} concurrent bodies of {:.1} MiB ({} messages each), answered {:?}",
            report.concurrent,
            report.body_bytes as f64 / f64::from(1 << 20),
            report.messages,
            report.statuses
        );
        println!(
            "  resident before {:.0} MiB, peak {:.0} MiB: {:.0} MiB per body in flight ({:.1}x its size); {:.2} s",
            report.resident_before_mib,
            report.resident_peak_mib,
            report.per_body_mib,
            report.per_body_ratio,
            report.seconds
        );
    }
    Ok(())
}

/// `perpetuity bench prefix`: the session through a proxy over a fresh store
/// (`proxy::prefix`).
fn bench_prefix(
    turns: usize,
    steps: usize,
    json: bool,
    dictionary: &DictionaryArgs,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        turns >= 2 && steps >= 1,
        "--turns must be at least 2 and --steps at least 1"
    );
    let place = BenchDir::new(None, "prefix", Existing::Refuse)?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let report = runtime.block_on(async {
        let (upstream, received) = proxy::prefix::recording_upstream().await?;
        let config = proxy::ProxyConfig {
            anthropic: format!("http://{upstream}"),
            ..proxy::ProxyConfig::default()
        };
        let state = fresh_state(&place, dictionary, config)?;
        anyhow::Ok(proxy::prefix::measure(state, received, turns, steps).await?)
    })?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "bench prefix: {} turns of {} tool steps, {} requests",
            report.turns, report.steps, report.requests
        );
        for (label, shares) in [("direct", &report.direct), ("proxy", &report.proxy)] {
            println!(
                "  {label:<7} prefix share in tool loops {:.3}, across turns {:.3}; mean input {:.0} bytes",
                shares.in_loop, shares.across_turns, shares.mean_input_bytes
            );
        }
        println!(
            "  in tool loops, proxy / direct: {:.3}",
            report.in_loop_ratio
        );
    }
    Ok(())
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

fn bench_ingest(
    messages: usize,
    users: usize,
    data: Option<PathBuf>,
    sync: bool,
    dictionary: &DictionaryArgs,
) -> anyhow::Result<()> {
    anyhow::ensure!(users > 0, "--users must be at least 1");
    let place = BenchDir::new(data, "ingest", Existing::Refuse)?;
    let data = DataArgs {
        dir: place.dir.clone(),
        sync_writes: sync,
        uncompressed: false,
    };
    let memory = dictionary.open(&data)?;
    let input = measure::synthetic_messages(messages, users, measure::MESSAGE_SEED);
    let summary = ingest::ingest(
        &memory.store,
        &memory.dictionary,
        &input,
        progress_printer("bench ingest"),
    )?;
    let threads = rayon::current_num_threads();
    println!(
        "bench ingest: {} messages, {} rows, {} tokens, {} users, WAL on, sync {}, {threads} threads: {:.2?}, {:.0} rows/s",
        summary.messages,
        summary.rows,
        summary.tokens,
        users,
        if sync { "every batch" } else { "off" },
        summary.elapsed,
        summary.rows_per_second()
    );
    std::io::stdout().flush()?;
    Ok(())
}

fn bench_backup(
    rows: usize,
    users: usize,
    writers: usize,
    seconds: f64,
    json: bool,
    data: Option<PathBuf>,
    dictionary: &DictionaryArgs,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        users > 0 && writers > 0,
        "--users and --writers must be at least 1"
    );
    let settings = measure::ScanSettings {
        rows,
        users,
        threads: 1,
        queries: 0,
        fidelity_queries: 0,
    };
    let (place, memory) = synthetic_memory(data, settings, dictionary, "backup")?;
    let beside = |what: &str| {
        let mut name = place.dir.file_name().unwrap_or_default().to_os_string();
        name.push(format!(".bench-{what}-{}", std::process::id()));
        place.dir.with_file_name(name)
    };
    let (to, restored) = (beside("backup"), beside("restored"));
    let warmup = std::time::Duration::from_secs_f64(seconds);
    let report = measure::backup_under_load(&memory, &to, &restored, writers, warmup);
    for dir in [&to, &restored] {
        if let Err(err) = std::fs::remove_dir_all(dir) {
            eprintln!("could not remove {}: {err}", dir.display());
        }
    }
    let report = report?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "bench backup: {} rows, {writers} writers: backup {:.1} ms ({} files, {} of them table files, {:.0} MiB), restore {:.1} ms; \
             capture p50/p99 before {:.2}/{:.2} ms ({} captures), during {:.2}/{:.2} ms, max {:.2} ms ({} captures)",
            report.rows,
            report.backup_ms,
            report.files,
            report.table_files,
            report.bytes as f64 / (1 << 20) as f64,
            report.restore_ms,
            report.capture_before_p50_ms,
            report.capture_before_p99_ms,
            report.captures_before,
            report.capture_during_p50_ms,
            report.capture_during_p99_ms,
            report.capture_during_max_ms,
            report.captures_during
        );
    }
    Ok(())
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

/// `bench proxy`: the benchmark users' memory (`rows` spread over `calls.users`, made once per
/// data directory), then the measurement over loopback.
fn bench_proxy(
    rows: usize,
    calls: proxy::load::Calls,
    data: Option<PathBuf>,
    json: bool,
    dictionary: &DictionaryArgs,
) -> anyhow::Result<()> {
    let proxy::load::Calls {
        users,
        concurrency,
        requests,
    } = calls;
    anyhow::ensure!(
        concurrency > 0 && requests > 0 && users > 0,
        "--users, --concurrency and --requests must be at least 1"
    );
    let place = BenchDir::new(data, "proxy", Existing::Reuse)?;
    let memory = dictionary.open(&DataArgs {
        dir: place.dir.clone(),
        sync_writes: false,
        uncompressed: false,
    })?;
    let secret = proxy::identity::Secret::load_or_create(&place.dir)?;
    let user_keys: Vec<String> = (0..users)
        .map(|u| secret.user_key(&proxy::load::credential(u), None))
        .collect();
    let holds = |key: &String| -> anyhow::Result<bool> {
        Ok(memory.store.user_key(UserId::from_key(key))?.is_some())
    };
    let (first, last) = (holds(&user_keys[0])?, holds(&user_keys[users - 1])?);
    anyhow::ensure!(
        first == last,
        "{} holds a proxy benchmark of another number of users: give a fresh --data",
        place.dir.display()
    );
    if !first && rows > 0 {
        let mut messages = measure::synthetic_messages(rows, users, measure::MESSAGE_SEED);
        for (i, message) in messages.iter_mut().enumerate() {
            message.user_key.clone_from(&user_keys[i % users]);
        }
        ingest::ingest(
            &memory.store,
            &memory.dictionary,
            &messages,
            progress_printer("proxy"),
        )?;
    }
    let (engine, _, _) = Engine::open(memory, Kernels::detect(false))?;
    let (held, scope_rows) = {
        let generation = engine.generation();
        let arena = generation.arena.read();
        (
            arena.rows(),
            arena.scope_rows(&[UserId::from_key(&user_keys[0])]),
        )
    };
    let questions: Vec<String> = measure::synthetic_queries(requests.min(1_000), 1)
        .into_iter()
        .map(|(_, text)| text)
        .collect();
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let report = runtime.block_on(async {
        let upstream = proxy::load::local_upstream().await?;
        let config = proxy::ProxyConfig {
            openai: format!("http://{upstream}"),
            max_concurrent: concurrency.max(256),
            ..proxy::ProxyConfig::default()
        };
        let state = Arc::new(proxy::State::new(engine, secret, config));
        proxy::load::measure(state, upstream, (held, scope_rows), calls, &questions).await
    })?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let line = |label: &str, t: &proxy::load::Timing| {
            println!(
                "  {label:<18} first byte p50 {:.2} ms, p99 {:.2} ms; total p50 {:.2} ms, p99 {:.2} ms",
                t.first_byte_p50_ms, t.first_byte_p99_ms, t.total_p50_ms, t.total_p99_ms
            )
        };
        println!(
            "bench proxy: {} rows over {} users ({} in the first user's scope), {} in flight, {} requests each way",
            report.rows,
            report.calls.users,
            report.scope_rows,
            report.calls.concurrency,
            report.calls.requests
        );
        line("direct", &report.direct);
        line("proxy", &report.proxy);
        line("proxy, recall off", &report.proxy_recall_off);
        println!(
            "  added p99 time to first byte: {:.2} ms with memory, {:.2} ms with recall off",
            report.added_first_byte_p99_ms, report.added_first_byte_p99_recall_off_ms
        );
    }
    Ok(())
}

/// The fidelity report: one entry per part that ran.
#[derive(serde::Serialize)]
struct FidelityReport {
    locomo_own_scope: Option<measure::Fidelity>,
    locomo_pooled_scope: Option<measure::Fidelity>,
    synthetic: Option<SyntheticFidelity>,
}

#[derive(serde::Serialize)]
struct SyntheticFidelity {
    rows: usize,
    users: usize,
    #[serde(flatten)]
    fidelity: measure::Fidelity,
}

fn bench_fidelity(
    locomo: Option<&Path>,
    settings: measure::ScanSettings,
    data: Option<PathBuf>,
    json: bool,
    dictionary: &DictionaryArgs,
) -> anyhow::Result<()> {
    let kernels = Kernels::detect(false);
    eprintln!("bench fidelity: kernels {}", kernels.describe());
    let mut report = FidelityReport {
        locomo_own_scope: None,
        locomo_pooled_scope: None,
        synthetic: None,
    };
    if let Some(file) = locomo {
        let dataset = datasets::load(Format::Locomo, file)?;
        let scratch = BenchDir::new(None, "fidelity-locomo", Existing::Refuse)?;
        let memory = dictionary.open(&DataArgs {
            dir: scratch.dir.clone(),
            sync_writes: false,
            uncompressed: false,
        })?;
        ingest::ingest(
            &memory.store,
            &memory.dictionary,
            &dataset.messages,
            progress_printer("fidelity-locomo"),
        )?;
        let (engine, _, _) = Engine::open(memory, kernels)?;
        let generation = engine.generation();
        let (dictionary, arena) = (&generation.memory.dictionary, generation.arena.read());
        let mut everyone: Vec<UserId> = dataset
            .questions
            .iter()
            .map(|q| UserId::from_key(&q.user_key))
            .collect();
        everyone.sort_unstable();
        everyone.dedup();
        let own: Vec<(Vec<UserId>, String)> = dataset
            .questions
            .iter()
            .map(|q| (vec![UserId::from_key(&q.user_key)], q.question.clone()))
            .collect();
        let pooled: Vec<(Vec<UserId>, String)> = dataset
            .questions
            .iter()
            .map(|q| (everyone.clone(), q.question.clone()))
            .collect();
        eprintln!(
            "bench fidelity: {} LoCoMo questions, own and pooled scope",
            own.len()
        );
        report.locomo_own_scope = Some(measure::fidelity(dictionary, &arena, &kernels, &own));
        report.locomo_pooled_scope = Some(measure::fidelity(dictionary, &arena, &kernels, &pooled));
    }
    if settings.rows > 0 {
        anyhow::ensure!(settings.users > 0, "--users must be at least 1");
        let (_place, memory) = synthetic_memory(data, settings, dictionary, "fidelity")?;
        let started = Instant::now();
        let (engine, _, _) = Engine::open(memory, kernels)?;
        let generation = engine.generation();
        let arena = generation.arena.read();
        eprintln!(
            "bench fidelity: arena of {} rows ready in {:.1?}; {} synthetic queries",
            arena.rows(),
            started.elapsed(),
            settings.queries
        );
        let asked: Vec<(Vec<UserId>, String)> =
            measure::synthetic_queries(settings.queries, settings.users)
                .into_iter()
                .map(|(user, text)| (vec![user], text))
                .collect();
        report.synthetic = Some(SyntheticFidelity {
            rows: arena.rows(),
            users: settings.users,
            fidelity: measure::fidelity(&generation.memory.dictionary, &arena, &kernels, &asked),
        });
    }
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        let line = |name: &str, f: &measure::Fidelity| {
            let [eighth, quarter, half] = f.agree_shallower;
            println!(
                "  {name}: {} of {} top-10 sets equal brute force's = {:.4} \
                 (with stage one keeping 1/8, 1/4, 1/2 of its candidates: {eighth}, {quarter}, {half})",
                f.agree, f.queries, f.share
            );
        };
        println!("bench fidelity (target >= 0.995):");
        if let Some(f) = &report.locomo_own_scope {
            line("LoCoMo, each question in its user's scope", f);
        }
        if let Some(f) = &report.locomo_pooled_scope {
            line("LoCoMo, every conversation pooled in one scope", f);
        }
        if let Some(s) = &report.synthetic {
            line(
                &format!("synthetic, {} rows over {} users", s.rows, s.users),
                &s.fidelity,
            );
        }
    }
    Ok(())
}

fn bench_scan(
    settings: measure::ScanSettings,
    data: Option<PathBuf>,
    json: bool,
    during_rederive: bool,
    dictionary: &DictionaryArgs,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        settings.users > 0 && settings.rows > 0,
        "--rows and --users must be at least 1"
    );
    anyhow::ensure!(settings.threads > 0, "--threads must be at least 1");
    let (_place, memory) = synthetic_memory(data, settings, dictionary, "scan")?;
    let kernels = Kernels::detect(false);
    eprintln!("bench scan: kernels {}", kernels.describe());
    let done = |store: &Store| store.dark().map(|dark| dark.map_or(0, |d| d.done));
    let done_before = done(&memory.store)?;
    let rederiving = during_rederive.then(|| {
        let store = Arc::clone(&memory.store);
        std::thread::spawn(move || {
            let started = Instant::now();
            let before = store.dark()?.map_or(0, |dark| dark.done);
            perpetuity::swap::background_pool()
                .install(|| perpetuity::swap::rederive(&store, |_| {}))
                .map(|state| (state.done - before, state.version, started.elapsed()))
        })
    });
    let report = measure::scan(&memory, &kernels, settings)?;
    if let Some(thread) = rederiving {
        let during = done(&memory.store)? - done_before;
        let (rows, version, elapsed) = thread.join().expect("the re-derivation thread")?;
        eprintln!(
            "bench scan: re-derived {rows} rows under {version} in {elapsed:.2?} ({:.0} rows/s, half the cores), {during} of them before the benchmark ended",
            rows as f64 / elapsed.as_secs_f64()
        );
    }
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "bench scan: {} rows over {} users, {} threads, {} bytes/row resident\n  first pass (one core, largest scope): {:.0}M rows/s, {:.2} GB/s = {:.0}% of read bandwidth {:.2} GB/s\n  first pass (all {} threads, its top-k included): {:.2} GB/s = {:.0}% of their read bandwidth {:.2} GB/s\n  second pass (one core, its candidates): {:.2}M rows/s\n  query (catch-up + prepare + search, top 10): p50 {:.2} ms, p99 {:.2} ms\n  fidelity (two-stage top 10 = brute force): {:.4}\n  arena {} and caught up in {:.0} ms ({:.0} rows/s caught up)\n  stage one on {} simulated cores (replayed on one): {:.2}x one ({:.2} ms alone, slowest worker {:.2} ms + merge {:.2} ms; needs {:.1} GB/s)",
            report.rows,
            report.users,
            report.threads,
            report.bytes_per_row,
            report.first_pass_rows_per_s_per_core / 1e6,
            report.first_pass_bytes_per_s / 1e9,
            100.0 * report.bandwidth_ratio,
            report.memory_read_bytes_per_s / 1e9,
            report.threads,
            report.first_pass_all_threads_bytes_per_s / 1e9,
            100.0 * report.bandwidth_ratio_all_threads,
            report.memory_read_all_threads_bytes_per_s / 1e9,
            report.second_pass_rows_per_s_per_core / 1e6,
            report.query_p50_ms,
            report.query_p99_ms,
            report.fidelity_top10,
            if report.arena_mapped {
                "mapped"
            } else {
                "rebuilt"
            },
            report.arena_open_ms,
            report.catch_up_rows_per_s,
            report.simulated_workers,
            report.simulated_speedup,
            report.simulated_one_worker_ms,
            report.simulated_slowest_worker_ms,
            report.simulated_merge_ms,
            report.simulated_read_bytes_per_s / 1e9,
        );
    }
    Ok(())
}
