//! The memory's benchmarks: ingest, backup beside writers, the scan, and two-stage fidelity.

use super::*;

pub(super) fn bench_ingest(
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

pub(super) fn bench_backup(
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

pub(super) fn bench_fidelity(
    locomo: Option<&Path>,
    kernels: Kernels,
    settings: measure::ScanSettings,
    data: Option<PathBuf>,
    json: bool,
    dictionary: &DictionaryArgs,
) -> anyhow::Result<()> {
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

pub(super) fn bench_scan(
    settings: measure::ScanSettings,
    kernels: Kernels,
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
