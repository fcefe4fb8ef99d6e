//! The benchmarks through the proxy: a streamed call's added latency, the prompt-cache prefix,
//! and the resident memory of large bodies.

use super::*;

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
    let (engine, _, _) = Engine::open(memory, Kernels::detect(Ceiling::Native))?;
    Ok(Arc::new(proxy::State::new(engine, secret, config)))
}

/// `perpetuity bench bodies`: peak resident memory while large bodies pass through a proxy
/// over a fresh store (`proxy::load::bodies`).
pub(super) fn bench_bodies(
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
        let upstream = proxy::load::local_upstream(Duration::ZERO).await?;
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
pub(super) fn bench_prefix(
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

/// `bench proxy`: the benchmark users' memory (`rows` spread over `calls.users`, made once per
/// data directory), then the measurement over loopback.
pub(super) fn bench_proxy(
    rows: usize,
    calls: proxy::load::Calls,
    (first_byte_ms, hostile): (u64, bool),
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
    let (engine, _, _) = Engine::open(memory, Kernels::detect(Ceiling::Native))?;
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
    if hostile {
        let report = runtime.block_on(async {
            let upstream = proxy::load::local_upstream(Duration::ZERO).await?;
            let config = proxy::ProxyConfig {
                openai: format!("http://{upstream}"),
                ..proxy::ProxyConfig::default()
            };
            let state = Arc::new(proxy::State::new(engine, secret, config));
            proxy::hostile::measure(state, (held, scope_rows), requests, &questions).await
        })?;
        return print_hostile(&report, json);
    }
    let report = runtime.block_on(async {
        let first_byte = Duration::from_millis(first_byte_ms);
        let upstream = proxy::load::local_upstream(first_byte).await?;
        let config = proxy::ProxyConfig {
            openai: format!("http://{upstream}"),
            max_concurrent: concurrency.max(256),
            ..proxy::ProxyConfig::default()
        };
        let state = Arc::new(proxy::State::new(engine, secret, config));
        proxy::load::measure(
            state,
            (upstream, first_byte),
            (held, scope_rows),
            calls,
            &questions,
        )
        .await
    })?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let line = |label: &str, t: &proxy::load::Timing| {
            println!(
                "  {label:<18} first byte p50 {:.2} ms, p99 {:.2} ms; total p50 {:.2} ms, p99 {:.2} ms; {:.0} calls/s, {:.2} ms CPU a call (the CPU allows {:.0} a second)",
                t.first_byte_p50_ms,
                t.first_byte_p99_ms,
                t.total_p50_ms,
                t.total_p99_ms,
                t.calls_per_s,
                t.cpu_ms_per_call,
                t.cpu_bound_calls_per_s
            )
        };
        println!(
            "bench proxy: {} rows over {} users ({} in the first user's scope), {} in flight, {} requests each way, the upstream's first byte after {} ms",
            report.rows,
            report.calls.users,
            report.scope_rows,
            report.calls.concurrency,
            report.calls.requests,
            report.first_byte_upstream_ms
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

/// `bench proxy --hostile`'s report, as JSON or lines.
fn print_hostile(report: &proxy::hostile::HostileReport, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
        return Ok(());
    }
    println!(
        "bench proxy --hostile: {} rows ({} in the user's scope), {} calls of one user a pass, one at a time",
        report.rows, report.scope_rows, report.requests
    );
    for pass in &report.passes {
        let load = pass
            .load
            .map_or("unloaded".to_owned(), |load| format!("{load:?}"));
        println!(
            "  {load:<16} first byte p50 {:.2} ms, p99 {:.2} ms (+{:.2}), max {:.2} ms; {} failed, {} 503; hostile requests answered {} {:?}",
            pass.first_byte_p50_ms,
            pass.first_byte_p99_ms,
            pass.added_p99_ms,
            pass.first_byte_max_ms,
            pass.failed,
            pass.unavailable,
            pass.hostile_answered,
            pass.hostile_statuses
        );
    }
    println!(
        "  worst added p99 under a hostile request: {:.2} ms",
        report.worst_added_p99_ms
    );
    Ok(())
}
