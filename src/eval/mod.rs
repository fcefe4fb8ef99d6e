//! The evaluation harness (`perpetuity eval`): retrieval quality on a benchmark file, measured
//! through the path the proxy serves from (store → arena → search).
//!
//! The file is ingested into one pooled memory (every LoCoMo conversation, LongMemEval
//! question or RealMem persona is its own user; one store, one arena, one shared frequency
//! statistic). Every question that has evidence is asked as its user in probe mode: prepared
//! and searched, never captured; after the whole file, or for RealMem, as the file is replayed,
//! when the messages before the query's own turn are captured ([`replay`]). The retrieved rows are mapped back to the file's turns (the rows' source
//! turn ids; the chunks of one turn count once, at their best rank) and sessions (the rows'
//! conversations), and scored at both levels. Beside each figure stand plain BM25 over the same
//! user's rows in the same run, and the same two systems with each user alone in an isolated
//! memory (its own store and statistic), so what pooling costs or gains is visible. Figures
//! are also split over the even and odd users (LoCoMo conversations, LongMemEval questions) so
//! a constant tuned on one half can be checked on the other. With several shards
//! ([`run_sharded`]), the pooled memory is split: each shard holds some of the users in a store
//! of its own, with its own statistic, and each question is asked of its user's shard, so the
//! figures show what a sharded deployment loses against one statistic over every user.
//!
//! Questions without evidence are not scored, only counted: LongMemEval's abstention questions
//! (id ending in [`ABSTENTION_SUFFIX`]), questions whose file lists no evidence, and questions
//! whose every evidence string names no turn. Evidence strings that name no turn are listed
//! in the report, as are evidence turns the memory holds no row for.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::{self, Write as _};
use std::hash::Hash;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::ser::SerializeMap as _;
use serde::{Serialize, Serializer};

use crate::arena::{Arena, ArenaError};
use crate::capture::Message;
use crate::datasets::{self, Dataset, DatasetError, Format, Question};
use crate::dictionary::Dictionary;
use crate::dictionary::derive::RetrievalRow;
use crate::dictionary::stats::FrequencyTable;
use crate::ingest::{self, IngestSummary};
use crate::latency;
use crate::memory::Memory;
use crate::memory_tools::{Call, TurnState};
use crate::recall::{Ask, RecallConfig, question_query, recall, stretch};
use crate::relevance::{Bm25, mean_row_len};
use crate::retrieve::search_without;
use crate::scan::kernels::{Ceiling, Kernels};
use crate::store::{Store, StoreError, StoreOptions};
use crate::types::{Role, RowId, UserId};

mod metrics;
mod probe;
pub mod replay;
mod report;
mod shards;
#[cfg(test)]
mod tests;

pub use metrics::*;
use probe::*;
pub use report::*;
use shards::{Asked, ask_shards};
pub use shards::{jump_hash, shard_of};

/// Depths reported when `--k` is not given.
pub const DEFAULT_KS: [usize; 5] = [1, 3, 5, 10, 20];

/// LongMemEval marks its abstention questions (no answer in the haystack) by this id suffix.
pub const ABSTENTION_SUFFIX: &str = "_abs";

/// Rows each question retrieves (at least; more when a `k` is deeper): the exact rescore scores
/// them all, so the ranks past the tenth are exact, and session-level ranks need many rows per
/// distinct session.
pub const RANKED_ROWS: usize = 256;

/// Progress is reported about this often, and once at the end of each stage.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// Metrics measured at every depth `k`, in report order; `mrr` follows them once.
const PER_K: [&str; 4] = ["recall_any", "recall_all", "recall_frac", "ndcg"];

/// LoCoMo's category numbers as its official evaluation names them.
const LOCOMO_CATEGORIES: [(&str, &str); 5] = [
    ("1", "multi-hop"),
    ("2", "temporal"),
    ("3", "open-domain"),
    ("4", "single-hop"),
    ("5", "adversarial"),
];

/// An evaluation could not run.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// Class: client. The benchmark file is unusable.
    #[error(transparent)]
    Dataset(#[from] DatasetError),
    /// Class: internal or corruption (see [`StoreError`]).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Class: internal, corruption or configuration (see [`ArenaError`]).
    #[error(transparent)]
    Arena(#[from] ArenaError),
    /// Class: client. `--k` holds no depth, or a zero.
    #[error("--k needs one or more depths of at least 1 (got {ks:?})")]
    Depths { ks: Vec<usize> },
    /// Class: client. `--shards` is zero.
    #[error("--shards needs at least 1 shard")]
    NoShards,
    /// Class: client. Shards are ingested one by one, which a memory already holding rows
    /// cannot be split into.
    #[error(
        "{path} already holds rows, but a run over {shards} shards ingests each shard itself; \
         evaluate into an empty data directory"
    )]
    ShardsNotEmpty { path: PathBuf, shards: usize },
    /// Class: client. A reused data directory holds rows, but not every user of the file.
    #[error(
        "{path} already holds rows but lacks {missing} of the file's {users} users (first: {first}); \
         evaluate into an empty data directory"
    )]
    NotIngested {
        path: PathBuf,
        missing: usize,
        users: usize,
        first: String,
    },
    /// Class: client. The file's questions are asked partway through its history, which a
    /// memory already holding rows cannot replay.
    #[error(
        "{path} already holds rows, but this file's questions are asked as its history is replayed; \
         evaluate into an empty data directory"
    )]
    ReplayNotEmpty { path: PathBuf },
    /// Class: corruption. A stored row has no retrieval row.
    #[error("row {row} of user {user:016x} has no retrieval row")]
    MissingRetrieval { user: u64, row: u64 },
    /// Class: internal. A scratch folder could not be created.
    #[error("cannot create the scratch folder {path}: {source}")]
    Scratch {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A fresh folder under the system temp dir, removed with its contents when dropped.
#[derive(Debug)]
pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    /// Create `perpetuity-eval-<pid>-<n>-<label>` under the system temp dir.
    pub fn new(label: &str) -> Result<Self, EvalError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "perpetuity-eval-{}-{}-{label}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&path).map_err(|source| EvalError::Scratch {
            path: path.clone(),
            source,
        })?;
        Ok(Self { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if let Err(err) = std::fs::remove_dir_all(&self.path) {
            tracing::warn!(path = %self.path.display(), %err, "could not remove a scratch folder");
        }
    }
}

/// Where a run stands; the binary prints these on stderr.
#[derive(Debug, Clone, Copy)]
pub enum Progress {
    /// The pooled memory's ingest, after each write batch.
    Ingest {
        summary: IngestSummary,
        messages: usize,
    },
    /// The data directory already held the file's users; nothing was ingested.
    Reused,
    /// Questions asked of the pooled memory so far.
    Questions { asked: usize, total: usize },
    /// Users evaluated in isolated memories so far.
    Isolated { users: usize, total: usize },
    /// A shard's memory is being filled and asked (`--shards` above 1); `shard` from 0.
    Shard {
        shard: usize,
        total: usize,
        users: usize,
    },
}

impl fmt::Display for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ingest { summary, messages } => write!(
                f,
                "ingest {}/{messages} messages, {} rows, {:.0} rows/s",
                summary.messages,
                summary.rows,
                summary.rows_per_second()
            ),
            Self::Reused => write!(
                f,
                "the data directory holds the file's users; ingest skipped"
            ),
            Self::Questions { asked, total } => write!(f, "pooled: {asked}/{total} questions"),
            Self::Isolated { users, total } => write!(f, "isolated: {users}/{total} users"),
            Self::Shard {
                shard,
                total,
                users,
            } => write!(f, "shard {}/{total}: {users} users", shard + 1),
        }
    }
}

/// Lets a progress report through about once per [`PROGRESS_EVERY`], and always at the end.
#[derive(Debug, Default)]
struct Throttle {
    last: Option<Instant>,
}

impl Throttle {
    fn due(&mut self, last_step: bool) -> bool {
        let now = Instant::now();
        let due = last_step || self.last.is_none_or(|t| now - t >= PROGRESS_EVERY);
        if due {
            self.last = Some(now);
        }
        due
    }
}

/// Each user's runs of consecutive messages in `messages`, as index ranges in order.
fn user_runs(messages: &[Message]) -> HashMap<&str, Vec<std::ops::Range<usize>>> {
    let mut runs: HashMap<&str, Vec<std::ops::Range<usize>>> = HashMap::new();
    let mut start = 0;
    for run in messages.chunk_by(|a, b| a.user_key == b.user_key) {
        runs.entry(run[0].user_key.as_str())
            .or_default()
            .push(start..start + run.len());
        start += run.len();
    }
    runs
}

fn is_abstention(format: Format, question: &Question) -> bool {
    format == Format::Longmemeval && question.user_key.ends_with(ABSTENTION_SUFFIX)
}

/// Check that a memory already holding rows has every user of the file, and that no question
/// must be asked partway through the file (a replay needs an empty memory). Returns whether
/// the memory holds rows.
fn reused(store: &Store, dataset: &Dataset, users: &[&str]) -> Result<bool, EvalError> {
    if store.rows_since(RowId(0)).next().transpose()?.is_none() {
        return Ok(false);
    }
    if dataset.questions.iter().any(|q| q.replay_at.is_some()) {
        return Err(EvalError::ReplayNotEmpty {
            path: store.path().to_path_buf(),
        });
    }
    let mut missing = Vec::new();
    for &key in users {
        if store.user_key(UserId::from_key(key))?.is_none() {
            missing.push(key);
        }
    }
    if let Some(first) = missing.first() {
        return Err(EvalError::NotIngested {
            path: store.path().to_path_buf(),
            missing: missing.len(),
            users: users.len(),
            first: (*first).to_owned(),
        });
    }
    Ok(true)
}

/// The conversation the replayed agent session's tool rows are captured in.
pub const AGENT_CONVERSATION: &str = "agent session";

/// The tool rows of the replayed agent session ([`crate::proxy::prefix::tool_rows`]), for
/// every user.
fn agent_session(users: &[&str]) -> Vec<Message> {
    let rows = crate::proxy::prefix::tool_rows(6, 5);
    users
        .iter()
        .flat_map(|user| {
            rows.iter().map(|text| Message {
                user_key: (*user).to_owned(),
                conversation: AGENT_CONVERSATION.into(),
                role: Role::Tool,
                name: None,
                timestamp_ms: None,
                source_turn: None,
                text: text.clone(),
            })
        })
        .collect()
}

/// The messages a replay captures: `ranges` of `all`, in order, and `before_questions`
/// captured just before the first question is asked.
struct History<'a> {
    all: &'a [Message],
    ranges: Vec<std::ops::Range<usize>>,
    before_questions: Vec<Message>,
}

/// What a replay leaves: the answers (in the order asked), the caught-up arena and corpus,
/// and the ingest (`None` when nothing was captured).
struct Replayed {
    answers: Vec<Answers>,
    arena: Arena,
    corpus: Corpus,
    ingested: Option<IngestSummary>,
}

/// Capture `history` into `store` in order and ask `asked` (indexes into `questions`) on the
/// way, in probe mode: a question with a replay point once the messages before it are
/// captured, the others once all are. The arena and the corpus are caught up before each
/// point's questions, so nothing said after a question is searched or counted in the baseline.
#[allow(clippy::too_many_arguments)]
fn replay(
    store: &Store,
    dictionary: &Dictionary,
    kernels: &Kernels,
    frame: Option<(&Memory, &RecallConfig)>,
    history: History<'_>,
    (questions, asked): (&[Question], &[usize]),
    depth: usize,
    progress: &mut impl FnMut(&Progress),
) -> Result<Replayed, EvalError> {
    let end = history.all.len();
    let point = |a: usize| questions[asked[a]].replay_at.unwrap_or(end);
    let mut order: Vec<usize> = (0..asked.len()).collect();
    order.sort_by_key(|&a| point(a));
    let users: HashSet<UserId> = history
        .ranges
        .iter()
        .flat_map(|range| &history.all[range.clone()])
        .chain(&history.before_questions)
        .map(|m| UserId::from_key(&m.user_key))
        .chain(
            asked
                .iter()
                .map(|&q| UserId::from_key(&questions[q].user_key)),
        )
        .collect();
    let total =
        history.ranges.iter().map(|r| r.len()).sum::<usize>() + history.before_questions.len();
    let (mut arena, mut corpus) = (Arena::new(), Corpus::default());
    let mut ingested: Option<IngestSummary> = None;
    let mut capture = |messages: &[Message]| -> Result<(), StoreError> {
        if messages.is_empty() {
            return Ok(());
        }
        let before = ingested.unwrap_or_default();
        let mut throttle = Throttle::default();
        let summary = ingest::ingest(store, dictionary, messages, |summary, _| {
            let so_far = before.plus(summary);
            if throttle.due(so_far.messages as usize == total) {
                progress(&Progress::Ingest {
                    summary: so_far,
                    messages: total,
                });
            }
        })?;
        ingested = Some(before.plus(&summary));
        Ok(())
    };
    let (mut done, mut next) = (0, 0);
    let mut answers: Vec<Option<Answers>> = vec![None; asked.len()];
    let mut before_questions = Some(history.before_questions);
    loop {
        let at = order.get(next).map_or(end, |&a| point(a));
        for range in &history.ranges {
            let part = range.start.max(done)..range.end.min(at);
            if !part.is_empty() {
                capture(&history.all[part])?;
            }
        }
        done = at;
        if let Some(messages) = before_questions.take() {
            capture(&messages)?;
        }
        arena.catch_up(store, dictionary)?;
        corpus.catch_up(store, &users)?;
        if next == order.len() {
            break;
        }
        let probe = Probe {
            store,
            recall: frame.map_or(RecallConfig::default(), |(_, config)| *config),
            dictionary,
            arena: &arena,
            kernels,
            corpus: &corpus,
            frame,
        };
        while let Some(&a) = order.get(next).filter(|&&a| point(a) == at) {
            answers[a] = Some(probe.ask(&questions[asked[a]], depth)?);
            next += 1;
        }
    }
    Ok(Replayed {
        answers: answers
            .into_iter()
            .map(|a| a.expect("every asked question is answered"))
            .collect(),
        arena,
        corpus,
        ingested,
    })
}

/// Ask `asked` (indexes into the file's questions) with each of their users alone in a fresh
/// memory: the user's messages replayed into a scratch store, its own arena and statistic.
/// Answers come back in the order of `asked`.
fn ask_isolated(
    dictionary: &Dictionary,
    kernels: &Kernels,
    dataset: &Dataset,
    asked: &[usize],
    depth: usize,
    progress: &mut impl FnMut(&Progress),
) -> Result<Vec<Answers>, EvalError> {
    let mut runs = user_runs(&dataset.messages);
    // Only users with something to ask get a memory (not those of abstention questions).
    let users: Vec<&str> = first_occurrences(
        asked
            .iter()
            .map(|&q| dataset.questions[q].user_key.as_str()),
    );
    let mut throttle = Throttle::default();
    let mut answers: HashMap<usize, Answers> = HashMap::with_capacity(asked.len());
    for (u, &key) in users.iter().enumerate() {
        let scratch = ScratchDir::new(&format!("isolated-{u}"))?;
        let store = Store::open(scratch.path(), &StoreOptions::default())?;
        store.bind_dictionary(dictionary.version())?;
        let of_user: Vec<usize> = asked
            .iter()
            .copied()
            .filter(|&q| dataset.questions[q].user_key == key)
            .collect();
        let history = History {
            all: &dataset.messages,
            ranges: runs.remove(key).unwrap_or_default(),
            before_questions: Vec::new(),
        };
        let replayed = replay(
            &store,
            dictionary,
            kernels,
            None,
            history,
            (&dataset.questions, &of_user),
            depth,
            &mut |_| {},
        )?;
        answers.extend(of_user.into_iter().zip(replayed.answers));
        if throttle.due(u + 1 == users.len()) {
            progress(&Progress::Isolated {
                users: u + 1,
                total: users.len(),
            });
        }
    }
    Ok(asked
        .iter()
        .map(|q| {
            answers
                .remove(q)
                .expect("every asked question's user has an isolated memory")
        })
        .collect())
}

/// Evaluate `file` (in `format`) on the pooled `memory` at depths `ks`: ingest it (or reuse the
/// rows already there), ask every question with evidence, then ask each again with its user
/// alone in a scratch memory. `progress` hears where the run stands. The same as
/// [`run_sharded`] with one shard.
pub fn run(
    memory: &Memory,
    format: Format,
    file: &Path,
    ks: &[usize],
    agent_session: bool,
    progress: impl FnMut(&Progress),
) -> Result<Report, EvalError> {
    run_sharded(memory, format, file, ks, agent_session, 1, progress)
}

/// [`run`] with the file's users split over `shards` memories by [`shard_of`], each its own
/// store, arena and frequency statistic, every question asked of its user's shard only:
/// ours and BM25 both read the statistic of that shard, as a node of a sharded deployment
/// would. `memory` holds the first shard (and must be empty with more than one), the others
/// are scratch stores removed once asked. The isolated memories are as in [`run`]. With one
/// shard this is [`run`], and the report has no `shards`.
pub fn run_sharded(
    memory: &Memory,
    format: Format,
    file: &Path,
    ks: &[usize],
    agent_session: bool,
    shards: usize,
    mut progress: impl FnMut(&Progress),
) -> Result<Report, EvalError> {
    if shards == 0 {
        return Err(EvalError::NoShards);
    }
    let ks = depths(ks)?;
    let ranked_rows = RANKED_ROWS.max(ks[ks.len() - 1]);
    let dataset = datasets::load(format, file)?;
    let users: Vec<&str> = first_occurrences(
        dataset
            .questions
            .iter()
            .map(|q| q.user_key.as_str())
            .chain(dataset.messages.iter().map(|m| m.user_key.as_str())),
    );
    let reused = reused(&memory.store, &dataset, &users)?;
    if reused && shards > 1 {
        return Err(EvalError::ShardsNotEmpty {
            path: memory.store.path().to_path_buf(),
            shards,
        });
    }
    if reused {
        progress(&Progress::Reused);
    }

    let mut counts = Counts::default();
    let mut asked = Vec::new();
    for (i, q) in dataset.questions.iter().enumerate() {
        if is_abstention(format, q) {
            counts.abstention += 1;
        } else if !q.evidence_turns.is_empty() || !q.evidence_sessions.is_empty() {
            asked.push(i);
        } else if q.unresolved_evidence.is_empty() {
            counts.without_evidence += 1;
        } else {
            counts.evidence_unresolved += 1;
        }
    }
    counts.asked = asked.len();

    let kernels = Kernels::detect(Ceiling::Native);
    tracing::info!(kernels = %kernels.describe(), "scan kernels chosen");
    let recall_config = RecallConfig::default();
    let assigned: Vec<Vec<&str>> = (0..shards)
        .map(|s| {
            users
                .iter()
                .copied()
                .filter(|&user| shard_of(user, shards) == s)
                .collect()
        })
        .collect();
    let Asked {
        answers: pooled,
        stored_turns,
        rows,
        ingested,
        per_shard,
    } = ask_shards(
        memory,
        &kernels,
        &recall_config,
        &dataset,
        &assigned,
        (&asked, ranked_rows),
        (reused, agent_session),
        &mut progress,
    )?;
    let mut latency = latency::histogram();
    for answers in &pooled {
        latency::record(&mut latency, answers.elapsed);
    }
    let alone = ask_isolated(
        &memory.dictionary,
        &kernels,
        &dataset,
        &asked,
        ranked_rows,
        &mut progress,
    )?;

    let user_index: HashMap<&str, usize> = users.iter().enumerate().map(|(i, &u)| (u, i)).collect();
    let outcomes: Vec<Outcome<'_>> = asked
        .iter()
        .zip(pooled.iter().zip(&alone))
        .map(|(&q, (pooled, alone))| {
            let question = &dataset.questions[q];
            Outcome {
                question,
                half: user_index[question.user_key.as_str()] % 2,
                ours: Scored::new(question, &pooled.ours, pooled.frame.as_ref(), &ks),
                bm25: Scored::new(question, &pooled.bm25, None, &ks),
                isolated: Scored::new(question, &alone.ours, None, &ks),
                isolated_bm25: Scored::new(question, &alone.bm25, None, &ks),
            }
        })
        .collect();

    let categories: Vec<&str> =
        first_occurrences(dataset.questions.iter().map(|q| q.category.as_str()));
    let overall = |system: for<'o> fn(&'o Outcome<'o>) -> &'o Scored| {
        summarize(&ks, outcomes.iter().map(system))
    };
    let by_category =
        |system: for<'o> fn(&'o Outcome<'o>) -> &'o Scored| -> BTreeMap<String, Summary> {
            categories
                .iter()
                .map(|&c| {
                    let of_category = outcomes.iter().filter(|o| o.question.category == c);
                    (c.to_owned(), summarize(&ks, of_category.map(system)))
                })
                .collect()
        };
    let half = |h: usize| {
        let of_half = || outcomes.iter().filter(move |o| o.half == h);
        Half {
            overall: summarize(&ks, of_half().map(|o| &o.ours)),
            bm25: summarize(&ks, of_half().map(|o| &o.bm25)),
        }
    };

    let mut unresolved_evidence = Vec::new();
    let mut unstored_evidence = Vec::new();
    for (i, q) in dataset.questions.iter().enumerate() {
        let note = |evidence: &String| EvidenceNote {
            user: q.user_key.clone(),
            question: i,
            evidence: evidence.clone(),
        };
        unresolved_evidence.extend(q.unresolved_evidence.iter().map(note));
        let user = UserId::from_key(&q.user_key);
        unstored_evidence.extend(
            q.evidence_turns
                .iter()
                .filter(|&turn| !stored_turns.contains(&(user, turn.clone())))
                .map(note),
        );
    }

    Ok(Report {
        dataset: file.file_name().map_or_else(
            || file.display().to_string(),
            |name| name.to_string_lossy().into_owned(),
        ),
        format: format.name().to_owned(),
        dictionary: memory.dictionary.version().to_owned(),
        questions: dataset.questions.len(),
        counts,
        ranked_rows,
        overall: overall(|o| &o.ours),
        by_category: by_category(|o| &o.ours),
        bm25: overall(|o| &o.bm25),
        bm25_by_category: by_category(|o| &o.bm25),
        isolated: overall(|o| &o.isolated),
        isolated_by_category: by_category(|o| &o.isolated),
        isolated_bm25: overall(|o| &o.isolated_bm25),
        isolated_bm25_by_category: by_category(|o| &o.isolated_bm25),
        halves: Halves {
            even: half(0),
            odd: half(1),
        },
        latency_ms: Latency {
            p50: latency::ms(&latency, 0.5),
            p99: latency::ms(&latency, 0.99),
        },
        ingest_rows_per_s: ingested.map(|summary| summary.rows_per_second()),
        arena: ArenaSize {
            rows,
            bytes_per_row: Arena::bytes_per_row(),
            bytes: rows * Arena::bytes_per_row(),
        },
        users: users.len(),
        shards: (shards > 1).then(|| Sharding {
            count: shards,
            assignment: "jump".to_owned(),
            per_shard,
        }),
        skipped_records: dataset.skipped.clone(),
        unresolved_evidence,
        unstored_evidence,
        per_question: asked
            .iter()
            .zip(&pooled)
            .map(|(&q, answers)| QuestionRanks::new(q, &dataset.questions[q], answers))
            .collect(),
        ks,
    })
}
