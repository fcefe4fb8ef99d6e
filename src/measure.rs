//! Benchmarks that print figures (`perpetuity bench ...`): seeded synthetic input, the memory
//! bandwidth reference, the scan benchmark and the fidelity check. Figures go to
//! `docs/journal/benchmarks.md`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::arena::{Arena, ArenaError, Opened, SKETCH_ROW_BYTES, ScopeSketches};
use crate::capture::Message;
use crate::dictionary::Dictionary;
use crate::latency;
use crate::memory::Memory;
use crate::retrieve::{
    FirstPass, PreparedQuery, RESCORE_K, Retrieved, brute_force_many, first_pass, first_pass_k,
    refine, search, search_from,
};
use crate::scan::kernels::Kernels;
use crate::scan::topk::{Hit, SharedFloor, TopK, merge_floor, merged};
use crate::types::{Role, UserId};

/// Seed of the synthetic messages.
pub const MESSAGE_SEED: u64 = 0x9E37_79B9_7F4A_7C15;
/// Seed of the synthetic queries (a different stream from the messages).
pub const QUERY_SEED: u64 = 0xD1B5_4A32_D192_ED03;

/// A xorshift generator: deterministic, dependency-free, good enough for test text.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Common English words, drawn often.
const COMMON: &[&str] = &[
    "the", "we", "I", "my", "a", "to", "and", "it", "was", "about", "on", "for", "with", "that",
    "really", "went", "talked", "new", "next", "week",
];
/// Syllables of the rarer, content-bearing pseudo-words.
const SYLLABLES: &[&str] = &[
    "ka", "lo", "mi", "ren", "sa", "to", "vi", "nu", "pe", "dor", "an", "bel", "cor", "fin", "gar",
    "hol", "jun", "mar", "tes", "wil",
];

/// One sentence: common words mixed with pseudo-words from a vocabulary of 8,000, drawn with a
/// Zipf-like skew so some words are frequent and most are rare.
fn sentence(rng: &mut XorShift) -> String {
    let words = 8 + rng.below(40);
    let mut text = String::new();
    for w in 0..words {
        if w > 0 {
            text.push(' ');
        }
        if rng.below(3) == 0 {
            text.push_str(COMMON[rng.below(COMMON.len())]);
        } else {
            // Skewed rank in 0..8000: the minimum of two uniform draws favours low ranks.
            let rank = rng.below(8_000).min(rng.below(8_000));
            let mut r = rank;
            for _ in 0..3 {
                text.push_str(SYLLABLES[r % SYLLABLES.len()]);
                r /= SYLLABLES.len();
            }
        }
    }
    text.push('.');
    text
}

/// `count` seeded synthetic chat messages spread round-robin over `users` users, twenty
/// messages per conversation.
pub fn synthetic_messages(count: usize, users: usize, seed: u64) -> Vec<Message> {
    let mut rng = XorShift(seed);
    (0..count)
        .map(|i| Message {
            user_key: format!("bench-user-{}", i % users),
            conversation: format!("session-{}", i / (users * 20)),
            role: if i % 2 == 0 {
                Role::User
            } else {
                Role::Assistant
            },
            name: None,
            timestamp_ms: Some(1_700_000_000_000 + i as i64 * 1000),
            source_turn: None,
            text: sentence(&mut rng),
        })
        .collect()
}

/// Sequential read bandwidth of one core, in bytes/s: the median of five passes XOR-folding a
/// buffer of `bytes` bytes (make it larger than the last-level cache).
pub fn read_bandwidth(bytes: usize) -> f64 {
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a one-thread pool");
    read_bandwidth_on(&bandwidth_buffer(bytes), &one)
}

/// `bytes` bytes of seeded noise for [`read_bandwidth_on`] to read.
fn bandwidth_buffer(bytes: usize) -> Vec<u64> {
    let mut rng = XorShift(MESSAGE_SEED);
    (0..bytes / 8).map(|_| rng.next()).collect()
}

/// Read bandwidth of every thread of `pool` together, in bytes/s: the median of five passes,
/// each thread XOR-folding its own slices of `data`.
fn read_bandwidth_on(data: &[u64], pool: &rayon::ThreadPool) -> f64 {
    use rayon::prelude::*;
    const SLICE_WORDS: usize = 1 << 16;
    let fold = |slice: &[u64]| {
        let mut acc = [0u64; 8];
        for chunk in slice.chunks_exact(8) {
            for (a, w) in acc.iter_mut().zip(chunk) {
                *a ^= w;
            }
        }
        acc
    };
    let mut times: Vec<Duration> = (0..5)
        .map(|_| {
            let started = Instant::now();
            pool.install(|| {
                data.par_chunks(SLICE_WORDS).for_each(|slice| {
                    std::hint::black_box(fold(slice));
                });
            });
            started.elapsed()
        })
        .collect();
    times.sort();
    (data.len() * 8) as f64 / times[2].as_secs_f64()
}

/// The seeded synthetic queries of the benchmarks: a random user's scope and a sentence.
pub fn synthetic_queries(count: usize, users: usize) -> Vec<(UserId, String)> {
    let mut rng = XorShift(QUERY_SEED);
    (0..count)
        .map(|_| {
            let user = UserId::from_key(&format!("bench-user-{}", rng.below(users)));
            (user, sentence(&mut rng))
        })
        .collect()
}

/// Fractions of [`first_pass_k`] the fidelity check also keeps in stage one: how much margin
/// the rule leaves at this scope size.
pub const SHALLOWER: [(usize, usize); 3] = [(1, 8), (1, 4), (1, 2)];

/// How often the two-stage search's top 10 is the brute force's top 10 (as sets).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Fidelity {
    pub queries: usize,
    pub agree: usize,
    pub share: f64,
    /// The same count with stage one keeping only 1/8, 1/4 and 1/2 of [`first_pass_k`]
    /// candidates ([`SHALLOWER`]).
    pub agree_shallower: [usize; SHALLOWER.len()],
}

/// Ask every `(scope, text)` both ways and count the agreeing top-10 sets. Brute force runs
/// once per scope for all of that scope's queries (`brute_force_many`).
pub fn fidelity(
    dictionary: &Dictionary,
    arena: &Arena,
    kernels: &Kernels,
    asked: &[(Vec<UserId>, String)],
) -> Fidelity {
    let mut by_scope: BTreeMap<&[UserId], Vec<&str>> = BTreeMap::new();
    for (scope, text) in asked {
        by_scope.entry(scope).or_default().push(text);
    }
    let set = |hits: &[Retrieved]| {
        let mut rows: Vec<_> = hits.iter().map(|h| h.row).collect();
        rows.sort();
        rows
    };
    let mut agree = 0;
    let mut agree_shallower = [0; SHALLOWER.len()];
    for (scope, texts) in by_scope {
        let queries: Vec<PreparedQuery> = texts
            .iter()
            .map(|text| PreparedQuery::new(dictionary, arena, text))
            .collect();
        let exact = brute_force_many(dictionary, arena, scope, &queries, 10);
        let sketches = arena.scope_sketches(scope);
        let k = first_pass_k(arena.scope_rows(scope));
        for (query, exact) in queries.iter().zip(&exact) {
            let fast = search(dictionary, arena, kernels, scope, query, 10);
            agree += usize::from(set(&fast) == set(exact));
            // Stage one's best `k`, best first; each shallower depth keeps a prefix of them.
            let mut best = first_pass(&sketches, kernels, query, k);
            best.sort_unstable_by(Hit::rank_cmp);
            for (count, (num, den)) in agree_shallower.iter_mut().zip(SHALLOWER) {
                let mut kept = best[..(k * num / den).min(best.len())].to_vec();
                kept.sort_unstable_by_key(|hit| hit.key);
                let shallow = search_from(dictionary, arena, kernels, query, &kept, 10);
                *count += usize::from(set(&shallow) == set(exact));
            }
        }
    }
    Fidelity {
        queries: asked.len(),
        agree,
        agree_shallower,
        share: if asked.is_empty() {
            f64::NAN
        } else {
            agree as f64 / asked.len() as f64
        },
    }
}

/// What `perpetuity bench scan --json` prints; scripts rely on these names.
#[derive(Debug, Clone, Serialize)]
pub struct ScanReport {
    pub rows: usize,
    pub users: usize,
    pub threads: usize,
    pub bytes_per_row: usize,
    pub first_pass_rows_per_s_per_core: f64,
    pub first_pass_bytes_per_s: f64,
    /// Stage one on all `threads` (its top-k and merge included) against the read bandwidth of
    /// as many threads, measured in the same run: bytes/s and their ratio.
    pub first_pass_all_threads_bytes_per_s: f64,
    pub memory_read_all_threads_bytes_per_s: f64,
    pub bandwidth_ratio_all_threads: f64,
    /// Stage two alone (int8 cosine and exact BM25 of stage one's candidates), one core, in
    /// candidates per second.
    pub second_pass_rows_per_s_per_core: f64,
    pub memory_read_bytes_per_s: f64,
    pub bandwidth_ratio: f64,
    pub query_p50_ms: f64,
    pub query_p99_ms: f64,
    pub fidelity_top10: f64,
    /// Rows caught up per second when the arena was opened (null when it had nothing to
    /// catch up: mapped from the data directory and current).
    pub catch_up_rows_per_s: f64,
    /// Whether the arena was mapped from the data directory (false: rebuilt from the store).
    pub arena_mapped: bool,
    /// Opening (mapping or rebuilding) and catching up the arena, in milliseconds.
    pub arena_open_ms: f64,
    /// Stage one of one query on [`SIMULATED_WORKERS`] cores, replayed on one
    /// ([`simulate_workers`]); medians over [`SIMULATED_QUERIES`] queries.
    pub simulated_workers: usize,
    /// The whole scope by one worker, in milliseconds.
    pub simulated_one_worker_ms: f64,
    /// The slowest of the workers' shares, in milliseconds.
    pub simulated_slowest_worker_ms: f64,
    /// Merging the workers' lists, in milliseconds.
    pub simulated_merge_ms: f64,
    /// One worker's time over the slowest worker's and the merge's: the speedup the top-k and
    /// the split allow where every core reads at one core's rate.
    pub simulated_speedup: f64,
    /// The read rate those workers would need together (stage one's bytes over the slowest
    /// worker's and the merge's time), in bytes/s.
    pub simulated_read_bytes_per_s: f64,
}

/// Cores [`simulate_workers`] replays a query's stage one on, and over how many queries.
pub const SIMULATED_WORKERS: usize = 16;
pub const SIMULATED_QUERIES: usize = 20;

/// Pages a simulated worker scores in one turn before the next worker takes its turn: short
/// enough that the workers' floors rise together as on real cores, long enough that the clock
/// read around each turn costs nothing beside it.
const SIMULATED_TURN_PAGES: usize = 16;

/// One query's stage one simulated on `workers` cores, on this thread: the scope's pages split
/// into `workers` runs in order (as rayon splits a range), each worker with its own top `k`
/// sharing one floor (as [`crate::scan::topk::parallel_top_k`] has them), taking turns of
/// [`SIMULATED_TURN_PAGES`] pages; then each list cut to the merge's floor (on its worker, as
/// there) and the lists merged. Returns the time each worker spent in its turns and its cut,
/// the merge's time, and the hits (which must be [`first_pass`]'s).
pub fn simulate_workers(
    pass: &FirstPass,
    pages: usize,
    k: usize,
    workers: usize,
) -> (Vec<Duration>, Duration, Vec<Hit>) {
    let shared = Arc::new(SharedFloor::new(workers, workers));
    let mut tops: Vec<TopK> = (0..workers)
        .map(|w| TopK::sharing(k, shared.clone(), w))
        .collect();
    let runs: Vec<std::ops::Range<usize>> = (0..workers)
        .map(|w| w * pages / workers..(w + 1) * pages / workers)
        .collect();
    let mut spent = vec![Duration::ZERO; workers];
    let mut at: Vec<usize> = runs.iter().map(|run| run.start).collect();
    while (0..workers).any(|w| at[w] < runs[w].end) {
        for w in 0..workers {
            let end = (at[w] + SIMULATED_TURN_PAGES).min(runs[w].end);
            let started = Instant::now();
            for p in at[w]..end {
                pass.score_page(p, &mut tops[w]);
            }
            spent[w] += started.elapsed();
            at[w] = end;
        }
    }
    let floor = merge_floor(&tops);
    for (top, spent) in tops.iter_mut().zip(&mut spent) {
        let started = Instant::now();
        top.cut_to(floor);
        *spent += started.elapsed();
    }
    let started = Instant::now();
    let hits = merged(tops, k).into_key_order();
    (spent, started.elapsed(), hits)
}

/// Settings of one scan benchmark.
#[derive(Debug, Clone, Copy)]
pub struct ScanSettings {
    pub rows: usize,
    pub users: usize,
    pub threads: usize,
    pub queries: usize,
    pub fidelity_queries: usize,
}

/// Run the scan benchmark on a memory already holding `settings.rows` synthetic rows over
/// `settings.users` users: cold catch-up, first-pass throughput on one core over the largest
/// scope, query latency (catch-up + prepare + search, no network) on `threads` threads, and
/// the share of queries whose two-stage top 10 equals brute force's.
pub fn scan(
    memory: &Memory,
    kernels: &Kernels,
    settings: ScanSettings,
) -> Result<ScanReport, ArenaError> {
    // The arena as serving opens it: mapped from the data directory, or rebuilt from the store.
    let started = Instant::now();
    let (mut arena, opened) = Arena::open(&memory.store, &memory.dictionary)?;
    let caught = arena.catch_up(&memory.store, &memory.dictionary)?;
    let arena_open_ms = started.elapsed().as_secs_f64() * 1e3;
    let catch_up_rows_per_s = if caught > 0 {
        caught as f64 / started.elapsed().as_secs_f64()
    } else {
        f64::NAN
    };
    let queries = synthetic_queries(settings.queries.max(1), settings.users);

    // First pass alone on one core, over user 0's scope (all rows when there is one user).
    let scope = [UserId::from_key("bench-user-0")];
    let sketches = arena.scope_sketches(&scope);
    let scope_rows = arena.scope_rows(&scope);
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a one-thread pool");
    let query = PreparedQuery::new(&memory.dictionary, &arena, &queries[0].1);
    let median_of_five = |run: &(dyn Fn() + Sync)| {
        let mut times: Vec<Duration> = (0..5)
            .map(|_| {
                let started = Instant::now();
                one.install(run);
                started.elapsed()
            })
            .collect();
        times.sort();
        times[2]
    };
    let k = first_pass_k(scope_rows);
    let first_pass_rows_per_s_per_core = scope_rows as f64
        / median_of_five(&|| {
            std::hint::black_box(first_pass(&sketches, kernels, &query, k));
        })
        .as_secs_f64();
    // Stage two alone on one core over stage one's candidates: int8 cosine, exact BM25.
    let candidates = one.install(|| first_pass(&sketches, kernels, &query, k));
    let second_pass_rows_per_s_per_core = candidates.len() as f64
        / median_of_five(&|| {
            std::hint::black_box(refine(&arena, kernels, &query, &candidates, RESCORE_K));
        })
        .as_secs_f64();
    // Stage one reads a row's 2-bit code, lexical signature, scale α and term length: its part
    // of the sketch.
    let first_pass_bytes_per_row = SKETCH_ROW_BYTES;
    let first_pass_bytes_per_s = first_pass_rows_per_s_per_core * first_pass_bytes_per_row as f64;
    // One buffer read by one core here and by every thread of the query's pool below.
    let bandwidth_data = bandwidth_buffer(512 << 20);
    let memory_read_bytes_per_s = read_bandwidth_on(&bandwidth_data, &one);
    let simulated = simulated_scaling(
        &sketches,
        kernels,
        &one,
        k,
        |text| PreparedQuery::new(&memory.dictionary, &arena, text),
        &queries,
    );
    let stage_one_bytes = (scope_rows * first_pass_bytes_per_row) as f64;

    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(settings.threads)
        .build()
        .expect("a thread pool");
    let mut all_threads: Vec<Duration> = (0..5)
        .map(|_| {
            let started = Instant::now();
            pool.install(|| std::hint::black_box(first_pass(&sketches, kernels, &query, k)));
            started.elapsed()
        })
        .collect();
    all_threads.sort();
    let first_pass_all_threads_bytes_per_s = stage_one_bytes / all_threads[2].as_secs_f64();
    let memory_read_all_threads_bytes_per_s = read_bandwidth_on(&bandwidth_data, &pool);
    drop(bandwidth_data);
    let mut latency = latency::histogram();
    for (user, text) in &queries {
        let started = Instant::now();
        pool.install(|| {
            arena
                .catch_up(&memory.store, &memory.dictionary)
                .expect("catch-up");
            let query = PreparedQuery::new(&memory.dictionary, &arena, text);
            std::hint::black_box(search(
                &memory.dictionary,
                &arena,
                kernels,
                &[*user],
                &query,
                10,
            ));
        });
        latency::record(&mut latency, started.elapsed());
    }

    let asked: Vec<(Vec<UserId>, String)> = queries
        .iter()
        .take(settings.fidelity_queries)
        .map(|(user, text)| (vec![*user], text.clone()))
        .collect();
    let fidelity = pool.install(|| fidelity(&memory.dictionary, &arena, kernels, &asked));

    Ok(ScanReport {
        rows: arena.rows(),
        users: settings.users,
        threads: settings.threads,
        bytes_per_row: Arena::bytes_per_row(),
        first_pass_rows_per_s_per_core,
        first_pass_bytes_per_s,
        second_pass_rows_per_s_per_core,
        memory_read_bytes_per_s,
        bandwidth_ratio: first_pass_bytes_per_s / memory_read_bytes_per_s,
        first_pass_all_threads_bytes_per_s,
        memory_read_all_threads_bytes_per_s,
        bandwidth_ratio_all_threads: first_pass_all_threads_bytes_per_s
            / memory_read_all_threads_bytes_per_s,
        query_p50_ms: latency::ms(&latency, 0.5),
        query_p99_ms: latency::ms(&latency, 0.99),
        fidelity_top10: fidelity.share,
        catch_up_rows_per_s,
        arena_mapped: matches!(opened, Opened::Mapped { .. }),
        arena_open_ms,
        simulated_workers: SIMULATED_WORKERS,
        simulated_one_worker_ms: simulated.one_worker_ms,
        simulated_slowest_worker_ms: simulated.slowest_worker_ms,
        simulated_merge_ms: simulated.merge_ms,
        simulated_speedup: simulated.speedup,
        simulated_read_bytes_per_s: stage_one_bytes
            / ((simulated.slowest_worker_ms + simulated.merge_ms) / 1e3),
    })
}

/// Medians of [`simulate_workers`] over the first [`SIMULATED_QUERIES`] of `queries`.
struct Simulated {
    one_worker_ms: f64,
    slowest_worker_ms: f64,
    merge_ms: f64,
    speedup: f64,
}

/// Replay stage one of each query on one worker and on [`SIMULATED_WORKERS`], each result
/// checked against [`first_pass`] on the one-thread pool `one`.
fn simulated_scaling(
    sketches: &ScopeSketches<'_>,
    kernels: &Kernels,
    one: &rayon::ThreadPool,
    k: usize,
    prepare: impl Fn(&str) -> PreparedQuery,
    queries: &[(UserId, String)],
) -> Simulated {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (mut alone, mut slowest, mut merge, mut speedup) = (vec![], vec![], vec![], vec![]);
    for (_, text) in queries.iter().take(SIMULATED_QUERIES) {
        let query = prepare(text);
        let pass = FirstPass::new(sketches, kernels, &query);
        let (spent, merging, _) = simulate_workers(&pass, sketches.sketches.len(), k, 1);
        let one_worker = ms(spent[0] + merging);
        let (spent, merging, hits) =
            simulate_workers(&pass, sketches.sketches.len(), k, SIMULATED_WORKERS);
        assert_eq!(
            hits,
            one.install(|| first_pass(sketches, kernels, &query, k)),
            "stage one split over simulated workers returns what it returns on one"
        );
        let worst = ms(spent.into_iter().max().unwrap_or_default());
        alone.push(one_worker);
        slowest.push(worst);
        merge.push(ms(merging));
        speedup.push(one_worker / (worst + ms(merging)));
    }
    Simulated {
        one_worker_ms: median(alone),
        slowest_worker_ms: median(slowest),
        merge_ms: median(merge),
        speedup: median(speedup),
    }
}

/// The median of `values` (the upper of the middle two when their number is even; NaN when
/// there are none).
pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// What [`backup_under_load`] measured.
#[derive(Debug, Clone, Serialize)]
pub struct BackupReport {
    pub rows: u64,
    pub writers: usize,
    /// The backup itself ([`crate::backup::backup`]): checkpoint, dictionaries, manifest.
    pub backup_ms: f64,
    /// The backup's store files, how many of them are table files (hard-linked to the
    /// store's where the file system allows) and their bytes.
    pub files: u64,
    pub table_files: u64,
    pub bytes: u64,
    /// Making a data directory from the backup ([`crate::backup::restore`]), files only (the
    /// first open then builds the arena: `bench scan`'s cold open).
    pub restore_ms: f64,
    /// One message's capture (tokenize, derive, one write batch), before and while the backup
    /// ran: captures, p50, p99 and max.
    pub captures_before: u64,
    pub capture_before_p50_ms: f64,
    pub capture_before_p99_ms: f64,
    pub captures_during: u64,
    pub capture_during_p50_ms: f64,
    pub capture_during_p99_ms: f64,
    pub capture_during_max_ms: f64,
}

/// Take a backup of `memory` into the new folder `to` while `writers` threads capture one
/// synthetic message at a time, for `warmup` before it and on until it ends (at least
/// `warmup` again); then restore it into `restored`. Reports the backup's and the restore's
/// time and the capture latency before and during the backup. `to` and `restored` are left
/// for the caller to remove.
pub fn backup_under_load(
    memory: &Memory,
    to: &std::path::Path,
    restored: &std::path::Path,
    writers: usize,
    warmup: Duration,
) -> Result<BackupReport, crate::error::Error> {
    use std::sync::atomic::{AtomicU8, Ordering};
    // 0: before the backup, 1: during it, 2: stop.
    let phase = AtomicU8::new(0);
    let capturer = crate::capture::Capturer::new(&memory.dictionary);
    let (backup, timings) = std::thread::scope(|scope| {
        let loads: Vec<_> = (0..writers)
            .map(|writer| {
                let (phase, capturer, store) = (&phase, &capturer, &memory.store);
                scope.spawn(move || -> Result<_, crate::error::Error> {
                    let mut seen = [latency::histogram(), latency::histogram()];
                    let messages = synthetic_messages(100_000, 97, MESSAGE_SEED ^ writer as u64);
                    for message in messages.iter().cycle() {
                        let now = phase.load(Ordering::Acquire);
                        if now == 2 {
                            break;
                        }
                        let started = Instant::now();
                        capturer.capture(store, std::slice::from_ref(message))?;
                        latency::record(&mut seen[usize::from(now)], started.elapsed());
                    }
                    Ok(seen)
                })
            })
            .collect();
        std::thread::sleep(warmup);
        phase.store(1, Ordering::Release);
        let started = Instant::now();
        let backup =
            crate::backup::backup(memory, to).map(|manifest| (manifest, started.elapsed()));
        std::thread::sleep(warmup.saturating_sub(started.elapsed()));
        phase.store(2, Ordering::Release);
        let mut timings = [latency::histogram(), latency::histogram()];
        for load in loads {
            let seen = load.join().expect("a capture thread")?;
            for (all, one) in timings.iter_mut().zip(&seen) {
                all.add(one).expect("histograms of one range");
            }
        }
        Ok::<_, crate::error::Error>((backup, timings))
    })?;
    let (manifest, took) = backup?;
    let (mut files, mut table_files, mut bytes) = (0, 0, 0);
    let store_files = to.join("store");
    let listing = |source| crate::backup::BackupError::Io {
        path: store_files.clone(),
        source,
    };
    for entry in std::fs::read_dir(&store_files).map_err(listing)? {
        let entry = entry.map_err(listing)?;
        files += 1;
        bytes += entry.metadata().map_err(listing)?.len();
        table_files += u64::from(entry.path().extension().is_some_and(|e| e == "sst"));
    }
    let started = Instant::now();
    crate::backup::restore(to, restored)?;
    let restore_ms = started.elapsed().as_secs_f64() * 1e3;
    let [before, during] = timings;
    Ok(BackupReport {
        rows: manifest.rows_below - 1,
        writers,
        backup_ms: took.as_secs_f64() * 1e3,
        files,
        table_files,
        bytes,
        restore_ms,
        captures_before: before.len(),
        capture_before_p50_ms: latency::ms(&before, 0.5),
        capture_before_p99_ms: latency::ms(&before, 0.99),
        captures_during: during.len(),
        capture_during_p50_ms: latency::ms(&during, 0.5),
        capture_during_p99_ms: latency::ms(&during, 0.99),
        capture_during_max_ms: latency::ms(&during, 1.0),
    })
}
