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
use crate::recall::{Ask, RecallConfig, recall};
use crate::relevance::{Bm25, mean_row_len};
use crate::retrieve::{PreparedQuery, search};
use crate::scan::kernels::Kernels;
use crate::store::{Store, StoreError, StoreOptions};
use crate::types::{Role, RowId, UserId};

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

/// Units of the ranked list `ranked` (best first, no repeats) among the first `k` that are
/// evidence.
fn hits<T: PartialEq>(ranked: &[T], evidence: &[T], k: usize) -> usize {
    ranked
        .iter()
        .take(k)
        .filter(|unit| evidence.contains(unit))
        .count()
}

/// 1 when some evidence unit is in the top `k`, else 0.
pub fn recall_any<T: PartialEq>(ranked: &[T], evidence: &[T], k: usize) -> f64 {
    f64::from(hits(ranked, evidence, k) > 0)
}

/// 1 when every evidence unit is in the top `k`, else 0 (LongMemEval's "Recall@k").
pub fn recall_all<T: PartialEq>(ranked: &[T], evidence: &[T], k: usize) -> f64 {
    f64::from(hits(ranked, evidence, k) == evidence.len())
}

/// The share of the evidence units in the top `k`.
pub fn recall_frac<T: PartialEq>(ranked: &[T], evidence: &[T], k: usize) -> f64 {
    hits(ranked, evidence, k) as f64 / evidence.len() as f64
}

/// Discount of rank `i` (0-based): `1 / log2(i + 2)`.
fn discount(i: usize) -> f64 {
    1.0 / (i as f64 + 2.0).log2()
}

/// NDCG@k with binary relevance: `Σ_{i<k, ranked[i] ∈ evidence} 1/log2(i+2)` over the same sum
/// for an ideal list with every evidence unit first.
pub fn ndcg<T: PartialEq>(ranked: &[T], evidence: &[T], k: usize) -> f64 {
    let gained: f64 = ranked
        .iter()
        .take(k)
        .enumerate()
        .filter(|(_, unit)| evidence.contains(unit))
        .map(|(i, _)| discount(i))
        .sum();
    let ideal: f64 = (0..k.min(evidence.len())).map(discount).sum();
    gained / ideal
}

/// Reciprocal rank of the first evidence unit in `ranked` (0 when none was retrieved).
pub fn mrr<T: PartialEq>(ranked: &[T], evidence: &[T]) -> f64 {
    ranked
        .iter()
        .position(|unit| evidence.contains(unit))
        .map_or(0.0, |i| 1.0 / (i as f64 + 1.0))
}

/// Names of the reported metrics at depths `ks`, in report order: for each k `recall_any@k`,
/// `recall_all@k`, `recall_frac@k`, `ndcg@k`; then `mrr`.
pub fn metric_names(ks: &[usize]) -> Vec<String> {
    ks.iter()
        .flat_map(|k| PER_K.iter().map(move |m| format!("{m}@{k}")))
        .chain(std::iter::once("mrr".to_owned()))
        .collect()
}

/// One question's metrics at one level, in [`metric_names`] order. `evidence` is not empty.
pub fn question_metrics<T: PartialEq>(ranked: &[T], evidence: &[T], ks: &[usize]) -> Vec<f64> {
    ks.iter()
        .flat_map(|&k| {
            [
                recall_any(ranked, evidence, k),
                recall_all(ranked, evidence, k),
                recall_frac(ranked, evidence, k),
                ndcg(ranked, evidence, k),
            ]
        })
        .chain(std::iter::once(mrr(ranked, evidence)))
        .collect()
}

/// The items in order, each kept at its first occurrence only.
fn first_occurrences<T: Eq + Hash + Clone>(items: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut seen = HashSet::new();
    items
        .into_iter()
        .filter(|item| seen.insert(item.clone()))
        .collect()
}

/// Mean metrics of one level (turn or session) over a set of questions. Serialised as
/// `{"questions": n, "recall_any@1": x, ..., "mrr": x}`; a mean over no questions is `null`.
#[derive(Debug, Clone, PartialEq)]
pub struct Level {
    ks: Vec<usize>,
    questions: usize,
    sums: Vec<f64>,
}

impl Level {
    fn new(ks: &[usize]) -> Self {
        Self {
            ks: ks.to_vec(),
            questions: 0,
            sums: vec![0.0; ks.len() * PER_K.len() + 1],
        }
    }

    fn add(&mut self, metrics: &[f64]) {
        self.questions += 1;
        self.sums
            .iter_mut()
            .zip(metrics)
            .for_each(|(sum, x)| *sum += x);
    }

    /// Questions scored at this level.
    pub fn questions(&self) -> usize {
        self.questions
    }

    /// Each metric's name and mean, in [`metric_names`] order (`None` over no questions).
    pub fn means(&self) -> impl Iterator<Item = (String, Option<f64>)> + '_ {
        metric_names(&self.ks).into_iter().zip(
            self.sums
                .iter()
                .map(|sum| (self.questions > 0).then(|| sum / self.questions as f64)),
        )
    }
}

impl Serialize for Level {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.sums.len() + 1))?;
        map.serialize_entry("questions", &self.questions)?;
        for (name, mean) in self.means() {
            map.serialize_entry(&name, &mean)?;
        }
        map.end()
    }
}

/// Frame metrics of ours, pooled (`null` for the other systems): the share of questions whose
/// every evidence turn is inside the rendered frame, the share whose every evidence turn is in
/// the frame or in what one `memory_reopen` returns after it, and the frame's size in tokens.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FrameMetrics {
    pub evidence_in_frame: Option<f64>,
    pub evidence_in_frame_or_reopen: Option<f64>,
    pub median_tokens: Option<u64>,
    pub p90_tokens: Option<u64>,
}

/// One system's figures over a set of questions.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub turn: Level,
    pub session: Level,
    pub frame: FrameMetrics,
}

/// Ours and the baseline over one half of the users.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Half {
    pub overall: Summary,
    pub bm25: Summary,
}

/// The even-indexed and odd-indexed users' questions (users in file order).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Halves {
    pub even: Half,
    pub odd: Half,
}

/// How the file's questions were accounted for: asked and scored, or counted aside.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Counts {
    /// Questions asked: they have evidence at the turn or the session level.
    pub asked: usize,
    /// LongMemEval abstention questions (not asked).
    pub abstention: usize,
    /// Questions whose file lists no evidence (not asked).
    pub without_evidence: usize,
    /// Questions whose every evidence string names no turn (not asked).
    pub evidence_unresolved: usize,
}

/// An evidence string or turn that cannot count as found, with its question.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvidenceNote {
    /// The question's user (LoCoMo sample id, LongMemEval question id).
    pub user: String,
    /// The question's index in the file's question list (0-based, file order).
    pub question: usize,
    pub evidence: String,
}

/// Query latency of the pooled memory: prepare + search, one question at a time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p99: f64,
}

/// The pooled arena's size.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArenaSize {
    pub rows: usize,
    pub bytes_per_row: usize,
    /// `rows × bytes_per_row`: the columns of the held rows (the unused tail of a user's last
    /// page is not counted).
    pub bytes: usize,
}

/// One shard of a sharded run: its users and what its memory held and was asked.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Shard {
    /// The shard's users, in file order.
    pub users: Vec<String>,
    /// Rows its arena held when the last question was asked.
    pub rows: usize,
    /// Questions asked of it.
    pub asked: usize,
}

/// How a sharded run (`--shards` above 1) split the users: every shard in order, empty ones
/// included.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sharding {
    /// Shards, each its own store, arena and frequency statistic.
    pub count: usize,
    /// `"jump"`: [`shard_of`].
    pub assignment: String,
    pub per_shard: Vec<Shard>,
}

/// One asked question as the pooled memory answered it (`--per-question`): the rank (from 0)
/// of each of its evidence turns and sessions among the ranked units, ours and BM25 (`None`
/// where it was not retrieved), whether the frame showed each evidence turn, and the frame's
/// tokens.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QuestionRanks {
    /// The question's index in the file, from 0.
    pub question: usize,
    pub user: String,
    pub category: String,
    pub evidence_turns: Vec<String>,
    pub evidence_sessions: Vec<String>,
    pub ours_turns: Vec<Option<usize>>,
    pub bm25_turns: Vec<Option<usize>>,
    pub ours_sessions: Vec<Option<usize>>,
    pub bm25_sessions: Vec<Option<usize>>,
    pub in_frame: Vec<bool>,
    pub frame_tokens: Option<usize>,
}

impl QuestionRanks {
    fn new(index: usize, question: &Question, answers: &Answers) -> Self {
        let turns = evidence_turns(question);
        let ranks = |ranked: &[Turn]| {
            turns
                .iter()
                .map(|turn| ranked.iter().position(|t| t == turn))
                .collect()
        };
        let session_ranks = |ranked: &[String]| {
            question
                .evidence_sessions
                .iter()
                .map(|session| ranked.iter().position(|s| s == session))
                .collect()
        };
        Self {
            question: index,
            user: question.user_key.clone(),
            category: question.category.clone(),
            evidence_turns: question.evidence_turns.clone(),
            evidence_sessions: question.evidence_sessions.clone(),
            ours_turns: ranks(&answers.ours.turns),
            bm25_turns: ranks(&answers.bm25.turns),
            ours_sessions: session_ranks(&answers.ours.sessions),
            bm25_sessions: session_ranks(&answers.bm25.sessions),
            in_frame: answers.frame.as_ref().map_or_else(Vec::new, |shown| {
                turns.iter().map(|t| shown.turns.contains(t)).collect()
            }),
            frame_tokens: answers.frame.as_ref().map(|shown| shown.tokens),
        }
    }
}

/// What `perpetuity eval` measured; `--json` prints it (names in docs/eval.md).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The file's name.
    pub dataset: String,
    /// `locomo`, `longmemeval` or `realmem`.
    pub format: String,
    /// The serving dictionary's version.
    pub dictionary: String,
    /// Questions in the file.
    pub questions: usize,
    pub counts: Counts,
    pub ks: Vec<usize>,
    /// Rows each question retrieves ([`RANKED_ROWS`], or the deepest k when deeper).
    pub ranked_rows: usize,
    /// Ours, pooled, over every asked question.
    pub overall: Summary,
    /// Ours, pooled, per question category (LoCoMo's number, LongMemEval's question type).
    pub by_category: BTreeMap<String, Summary>,
    /// Plain BM25 over the same user's rows under the pooled statistic.
    pub bm25: Summary,
    pub bm25_by_category: BTreeMap<String, Summary>,
    /// Ours with each user alone in an isolated memory.
    pub isolated: Summary,
    pub isolated_by_category: BTreeMap<String, Summary>,
    /// BM25 with each user alone (its own statistic).
    pub isolated_bm25: Summary,
    pub isolated_bm25_by_category: BTreeMap<String, Summary>,
    pub halves: Halves,
    pub latency_ms: Latency,
    /// Rows per second of the pooled ingest; `null` when a data directory was reused.
    pub ingest_rows_per_s: Option<f64>,
    pub arena: ArenaSize,
    /// Users in the file.
    pub users: usize,
    /// How the users were split over shards; absent with one shard (the pooled memory). With
    /// several, `overall`, `bm25`, `halves`, the frame, `latency_ms`, `ingest_rows_per_s` and
    /// `arena` are those of the shards together, every question asked of its user's shard.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shards: Option<Sharding>,
    /// Evidence strings that name no turn of their conversation.
    pub unresolved_evidence: Vec<EvidenceNote>,
    /// Evidence turns the pooled memory holds no row for.
    pub unstored_evidence: Vec<EvidenceNote>,
    /// Every asked question's ranks, in the file's order (not in `--json`; `--per-question`
    /// writes them).
    #[serde(skip)]
    pub per_question: Vec<QuestionRanks>,
}

/// A retrieved row's turn: the file's turn id, or for a row captured without one, its message.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Turn {
    Source(String),
    Unlabelled(RowId),
}

/// A question's evidence turns as the ranked units name them.
fn evidence_turns(question: &Question) -> Vec<Turn> {
    question
        .evidence_turns
        .iter()
        .map(|id| Turn::Source(id.clone()))
        .collect()
}

/// A ranked answer at both levels, best first, each unit at its first occurrence.
#[derive(Debug, Clone)]
struct Ranked {
    turns: Vec<Turn>,
    sessions: Vec<String>,
}

/// What one memory returned for one question: ours and the baseline.
#[derive(Debug, Clone)]
struct Answers {
    ours: Ranked,
    bm25: Ranked,
    /// Ours as the frame showed it, where a frame was rendered.
    frame: Option<Shown>,
    /// Prepare + search of ours.
    elapsed: Duration,
}

/// The turns a rendered frame shows, its tokens, and the turns one `memory_reopen` after it
/// returns (the retrieved set's turns the frame left out).
#[derive(Debug, Clone)]
struct Shown {
    turns: HashSet<Turn>,
    tokens: usize,
    reopened: HashSet<Turn>,
}

/// What the harness reads of one store: each row's turn and session, and each asked user's
/// retrieval rows for the baseline, read as the store grows ([`Corpus::catch_up`]).
#[derive(Default)]
struct Corpus {
    units: HashMap<RowId, (Turn, String)>,
    rows: HashMap<UserId, Vec<(RowId, RetrievalRow)>>,
    stored_turns: HashSet<(UserId, String)>,
    /// Each user's latest turn time: the "now" a probe's frame is rendered at.
    latest: HashMap<UserId, i64>,
    /// Rows from here on are not read yet.
    next: RowId,
}

impl Corpus {
    /// Read the rows of `users` captured since the last call.
    fn catch_up(&mut self, store: &Store, users: &HashSet<UserId>) -> Result<(), EvalError> {
        for row in store.rows_since(self.next) {
            let row = row?;
            self.next = RowId(row.id.0 + 1);
            let user = row.user;
            if !users.contains(&user) {
                continue;
            }
            let retrieval = store
                .retrieval(user, row.id)?
                .ok_or(EvalError::MissingRetrieval {
                    user: user.0,
                    row: row.id.0,
                })?;
            if let Some(at) = row.timestamp_ms {
                let latest = self.latest.entry(user).or_insert(at);
                *latest = (*latest).max(at);
            }
            let turn = match row.source_turn {
                Some(id) => {
                    self.stored_turns.insert((user, id.clone()));
                    Turn::Source(id)
                }
                None => Turn::Unlabelled(row.message),
            };
            self.units.insert(row.id, (turn, row.conversation));
            self.rows.entry(user).or_default().push((row.id, retrieval));
        }
        Ok(())
    }

    fn ranked(&self, rows: impl IntoIterator<Item = RowId>) -> Ranked {
        let units: Vec<&(Turn, String)> = rows
            .into_iter()
            .filter_map(|row| self.units.get(&row))
            .collect();
        Ranked {
            turns: first_occurrences(units.iter().map(|(turn, _)| turn.clone())),
            sessions: first_occurrences(units.iter().map(|(_, session)| session.clone())),
        }
    }

    /// The baseline: every row of `user` scored by plain BM25 under the statistic `stats`,
    /// the best `depth` by score descending, then row id ascending.
    fn bm25(
        &self,
        stats: &FrequencyTable,
        user: UserId,
        query: &RetrievalRow,
        depth: usize,
    ) -> Vec<RowId> {
        let idf: Vec<f32> = query
            .terms
            .iter()
            .map(|&(term, _)| Bm25::idf(stats, term))
            .collect();
        let mean_len = mean_row_len(stats);
        let mut scored: Vec<(f32, RowId)> = self
            .rows
            .get(&user)
            .into_iter()
            .flatten()
            .map(|(id, row)| {
                let score =
                    Bm25::STANDARD.score(&query.terms, &idf, &row.terms, row.term_len(), mean_len);
                (score, *id)
            })
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        scored.into_iter().take(depth).map(|(_, id)| id).collect()
    }
}

/// One memory to ask: its caught-up arena and what the harness read of its store; with
/// `frame`, each question's frame is rendered too (probe mode: nothing written).
struct Probe<'a> {
    dictionary: &'a Dictionary,
    arena: &'a Arena,
    kernels: &'a Kernels,
    corpus: &'a Corpus,
    frame: Option<(&'a Memory, &'a RecallConfig)>,
}

impl Probe<'_> {
    /// Ask one question as its user, in probe mode (nothing is captured), both ways.
    fn ask(&self, question: &Question, depth: usize) -> Result<Answers, StoreError> {
        let user = UserId::from_key(&question.user_key);
        let started = Instant::now();
        let query = PreparedQuery::new(self.dictionary, self.arena, &question.question);
        let hits = search(
            self.dictionary,
            self.arena,
            self.kernels,
            &[user],
            &query,
            depth,
        );
        let elapsed = started.elapsed();
        let frame = match self.frame {
            Some((memory, config)) => {
                let ask = Ask {
                    user,
                    scope: &[user],
                    conversation: None,
                    question: &question.question,
                    probe: true,
                    hidden: &[],
                    now_ms: self.corpus.latest.get(&user).copied(),
                };
                let recall = recall(memory, self.arena, self.kernels, config, &ask)?;
                let turns_of = |rows: &[RowId]| -> HashSet<Turn> {
                    rows.iter()
                        .filter_map(|row| self.corpus.units.get(row))
                        .map(|(turn, _)| turn.clone())
                        .collect()
                };
                let turns = turns_of(&recall.frame.rows);
                // The tool reads each row it returns from the store: called only where the
                // frame left some evidence out.
                let reopened = if evidence_turns(question).iter().all(|t| turns.contains(t)) {
                    HashSet::new()
                } else {
                    let mut state = TurnState::new(
                        user,
                        &[user],
                        ask.now_ms,
                        recall.retrieved.iter().map(|r| RowId(r.row)).collect(),
                        &recall.frame.rows,
                    );
                    turns_of(
                        &state
                            .run(memory, self.arena, self.kernels, &Call::Reopen)?
                            .rows,
                    )
                };
                Some(Shown {
                    turns,
                    tokens: recall.frame.tokens,
                    reopened,
                })
            }
            None => None,
        };
        Ok(Answers {
            frame,
            ours: self.corpus.ranked(hits.into_iter().map(|hit| hit.row)),
            bm25: self.corpus.ranked(self.corpus.bm25(
                self.arena.stats(),
                user,
                &query.retrieval,
                depth,
            )),
            elapsed,
        })
    }
}

/// One question's frame: whether every evidence turn was shown, and whether every one was
/// shown or returned by one `memory_reopen` (`None` without turn evidence); the frame's tokens.
#[derive(Debug, Clone, Copy)]
struct FrameScore {
    all_in: Option<bool>,
    with_reopen: Option<bool>,
    tokens: usize,
}

/// One question's metrics at both levels (`None` where it has no evidence at that level), and
/// its frame's.
#[derive(Debug, Clone)]
struct Scored {
    turn: Option<Vec<f64>>,
    session: Option<Vec<f64>>,
    frame: Option<FrameScore>,
}

impl Scored {
    fn new(question: &Question, ranked: &Ranked, frame: Option<&Shown>, ks: &[usize]) -> Self {
        let turns = evidence_turns(question);
        let sessions = first_occurrences(question.evidence_sessions.iter().cloned());
        Self {
            turn: (!turns.is_empty()).then(|| question_metrics(&ranked.turns, &turns, ks)),
            session: (!sessions.is_empty())
                .then(|| question_metrics(&ranked.sessions, &sessions, ks)),
            frame: frame.map(|shown| {
                let all = |held: &dyn Fn(&Turn) -> bool| {
                    (!turns.is_empty()).then(|| turns.iter().all(held))
                };
                FrameScore {
                    all_in: all(&|t| shown.turns.contains(t)),
                    with_reopen: all(&|t| shown.turns.contains(t) || shown.reopened.contains(t)),
                    tokens: shown.tokens,
                }
            }),
        }
    }
}

/// Every asked question's scores under the four systems.
struct Outcome<'a> {
    question: &'a Question,
    /// 0 for an even-indexed user, 1 for an odd one.
    half: usize,
    ours: Scored,
    bm25: Scored,
    isolated: Scored,
    isolated_bm25: Scored,
}

fn summarize<'a>(ks: &[usize], scores: impl Iterator<Item = &'a Scored>) -> Summary {
    let (mut turn, mut session) = (Level::new(ks), Level::new(ks));
    let (mut in_frame, mut with_reopen, mut tokens) = (Vec::new(), Vec::new(), Vec::new());
    for scored in scores {
        if let Some(metrics) = &scored.turn {
            turn.add(metrics);
        }
        if let Some(metrics) = &scored.session {
            session.add(metrics);
        }
        if let Some(frame) = scored.frame {
            in_frame.extend(frame.all_in);
            with_reopen.extend(frame.with_reopen);
            tokens.push(frame.tokens as u64);
        }
    }
    tokens.sort_unstable();
    let quantile = |q: f64| {
        (!tokens.is_empty()).then(|| tokens[((tokens.len() - 1) as f64 * q).round() as usize])
    };
    let share = |held: &[bool]| {
        (!held.is_empty()).then(|| held.iter().filter(|&&b| b).count() as f64 / held.len() as f64)
    };
    Summary {
        turn,
        session,
        frame: FrameMetrics {
            evidence_in_frame: share(&in_frame),
            evidence_in_frame_or_reopen: share(&with_reopen),
            median_tokens: quantile(0.5),
            p90_tokens: quantile(0.9),
        },
    }
}

/// The depths sorted, without repeats; refused when empty or holding a zero.
fn depths(ks: &[usize]) -> Result<Vec<usize>, EvalError> {
    if ks.is_empty() || ks.contains(&0) {
        return Err(EvalError::Depths { ks: ks.to_vec() });
    }
    let mut ks = ks.to_vec();
    ks.sort_unstable();
    ks.dedup();
    Ok(ks)
}

/// The bucket of 64-bit `key` among `buckets` by jump consistent hash: a seeded linear
/// congruential walk over the bucket counts at which the key would move, stopping past
/// `buckets`. Stable (the same key, the same bucket, on every machine and run) and monotone:
/// going from `n` to `n + 1` buckets moves a key only into the new bucket, about `1 / (n + 1)`
/// of the keys. `buckets` is at least 1.
pub fn jump_hash(mut key: u64, buckets: usize) -> usize {
    let (mut bucket, mut next) = (0_i64, 0_i64);
    while next < buckets as i64 {
        bucket = next;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        next = ((bucket + 1) as f64 * ((1_i64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    bucket as usize
}

/// The shard (from 0) of the user named `key` among `shards`: [`jump_hash`] of its user id
/// ([`UserId::from_key`], the first 8 bytes of a SHA-256 of the key), the stable assignment
/// a load balancer over `shards` nodes would make. `shards` is at least 1.
pub fn shard_of(key: &str, shards: usize) -> usize {
    jump_hash(UserId::from_key(key).0, shards)
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

/// What the memories of a run left: the answers (in the order asked), each user's stored
/// turns, the rows held, the ingest (`None` when nothing was captured) and, per shard, its
/// users and size.
struct Asked {
    answers: Vec<Answers>,
    stored_turns: HashSet<(UserId, String)>,
    rows: usize,
    ingested: Option<IngestSummary>,
    per_shard: Vec<Shard>,
}

/// Ask `asked` (indexes into the file's questions) of the memories holding `shards` (each
/// shard's users, in file order), one shard after the other, each question of its user's
/// shard: the shard's users' messages replayed into its own store, arena and statistic, in
/// the file's order. `memory` holds the first shard; every other one that has users is a
/// fresh scratch store, removed once asked. With `reused`, nothing is captured (one shard
/// only); with `agent_session`, the agent session's tool rows of the shard's users are
/// captured before its first question. With one shard this is the pooled replay. Answers
/// come back in the order of `asked`.
#[allow(clippy::too_many_arguments)]
fn ask_shards(
    memory: &Memory,
    kernels: &Kernels,
    recall_config: &RecallConfig,
    dataset: &Dataset,
    shards: &[Vec<&str>],
    (asked, depth): (&[usize], usize),
    (reused, agent_session): (bool, bool),
    progress: &mut impl FnMut(&Progress),
) -> Result<Asked, EvalError> {
    let runs = user_runs(&dataset.messages);
    let mut answers: HashMap<usize, Answers> = HashMap::with_capacity(asked.len());
    let mut done = Asked {
        answers: Vec::with_capacity(asked.len()),
        stored_turns: HashSet::new(),
        rows: 0,
        ingested: None,
        per_shard: Vec::with_capacity(shards.len()),
    };
    for (s, users) in shards.iter().enumerate() {
        let of_shard: Vec<usize> = asked
            .iter()
            .copied()
            .filter(|&q| users.contains(&dataset.questions[q].user_key.as_str()))
            .collect();
        let mut shard = Shard {
            users: users.iter().map(|&u| u.to_owned()).collect(),
            rows: 0,
            asked: of_shard.len(),
        };
        if shards.len() > 1 {
            progress(&Progress::Shard {
                shard: s,
                total: shards.len(),
                users: users.len(),
            });
        }
        if users.is_empty() {
            done.per_shard.push(shard);
            continue;
        }
        // Declared before the memory that opens it, so the store is closed before the
        // folder is removed.
        let scratch;
        let opened;
        let shard_memory = if s == 0 {
            memory
        } else {
            scratch = ScratchDir::new(&format!("shard-{s}"))?;
            let store = Store::open(scratch.path(), &StoreOptions::default())?;
            store.bind_dictionary(memory.dictionary.version())?;
            opened = Memory {
                store: std::sync::Arc::new(store),
                dictionary: std::sync::Arc::clone(&memory.dictionary),
            };
            &opened
        };
        let mut ranges: Vec<std::ops::Range<usize>> = if reused {
            Vec::new()
        } else {
            users
                .iter()
                .flat_map(|u| runs.get(u).into_iter().flatten().cloned())
                .collect()
        };
        ranges.sort_by_key(|range| range.start);
        // Adjacent runs merged: one shard holding every user replays the file in one range.
        let ranges = ranges.into_iter().fold(
            Vec::new(),
            |mut merged: Vec<std::ops::Range<usize>>, range| {
                match merged.last_mut() {
                    Some(last) if last.end == range.start => last.end = range.end,
                    _ => merged.push(range),
                }
                merged
            },
        );
        let history = History {
            all: &dataset.messages,
            ranges,
            before_questions: if agent_session && !reused {
                self::agent_session(users)
            } else {
                Vec::new()
            },
        };
        let replayed = replay(
            &shard_memory.store,
            &shard_memory.dictionary,
            kernels,
            Some((shard_memory, recall_config)),
            history,
            (&dataset.questions, &of_shard),
            depth,
            progress,
        )?;
        answers.extend(of_shard.into_iter().zip(replayed.answers));
        done.stored_turns.extend(replayed.corpus.stored_turns);
        shard.rows = replayed.arena.rows();
        done.rows += shard.rows;
        if let Some(summary) = replayed.ingested {
            done.ingested = Some(done.ingested.unwrap_or_default().plus(&summary));
        }
        done.per_shard.push(shard);
    }
    done.answers = asked
        .iter()
        .map(|q| {
            answers
                .remove(q)
                .expect("every asked question's user is in a shard")
        })
        .collect();
    Ok(done)
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

    let kernels = Kernels::detect(false);
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

/// Width of a table's metric column.
const NAME_COLUMN: usize = 16;
/// Width of a table's figure columns (the widest header, "isolated BM25").
const FIGURE_COLUMN: usize = 13;

/// Write a table: a title line, then one row per metric, one column per level in `levels`
/// (same depths).
fn table(out: &mut String, title: &str, columns: &[&str], levels: &[&Level]) -> fmt::Result {
    writeln!(out, "\n{title}")?;
    write!(out, "  {:<NAME_COLUMN$}", "metric")?;
    for column in columns {
        write!(out, " {column:>FIGURE_COLUMN$}")?;
    }
    writeln!(out)?;
    let means: Vec<Vec<(String, Option<f64>)>> =
        levels.iter().map(|level| level.means().collect()).collect();
    for (row, (name, _)) in means[0].iter().enumerate() {
        write!(out, "  {name:<NAME_COLUMN$}")?;
        for level in &means {
            match level[row].1 {
                Some(mean) => write!(out, " {mean:>FIGURE_COLUMN$.3}")?,
                None => write!(out, " {:>FIGURE_COLUMN$}", "-")?,
            }
        }
        writeln!(out)?;
    }
    Ok(())
}

/// Write the turn-level and session-level tables of ours, BM25 and both isolated (a line
/// instead where no question has evidence at that level).
fn systems(out: &mut String, label: &str, summaries: [&Summary; 4]) -> fmt::Result {
    let columns = ["ours", "BM25", "isolated", "isolated BM25"];
    let turn = summaries.map(|s| &s.turn);
    let session = summaries.map(|s| &s.session);
    for (level, levels) in [("turn", turn), ("session", session)] {
        match levels[0].questions() {
            0 => writeln!(out, "\n{label}, {level} level: no question has evidence")?,
            n => table(
                out,
                &format!("{label}, {level} level: {n} questions"),
                &columns,
                &levels,
            )?,
        }
    }
    Ok(())
}

impl Report {
    /// A category's label: LoCoMo's number with its name, or LongMemEval's type as it is.
    fn category_label(&self, category: &str) -> String {
        LOCOMO_CATEGORIES
            .iter()
            .find(|(number, _)| self.format == "locomo" && *number == category)
            .map_or_else(
                || category.to_owned(),
                |(number, name)| format!("{number} ({name})"),
            )
    }

    /// `pooled`, or `sharded` when the users were split over shards.
    fn memory_label(&self) -> &'static str {
        if self.shards.is_some() {
            "sharded"
        } else {
            "pooled"
        }
    }

    /// The human-readable report: ours, BM25 and both isolated, per level and metric; the
    /// halves; with `by_category`, the same tables per question category.
    pub fn render(&self, by_category: bool) -> String {
        let mut out = String::new();
        self.write(&mut out, by_category)
            .expect("writing to a String cannot fail");
        out
    }

    fn write(&self, out: &mut String, by_category: bool) -> fmt::Result {
        let c = &self.counts;
        writeln!(
            out,
            "eval {} ({}, dictionary {}): {} users, {} rows, {} questions",
            self.dataset, self.format, self.dictionary, self.users, self.arena.rows, self.questions
        )?;
        if let Some(sharding) = &self.shards {
            let list = |of: fn(&Shard) -> usize| {
                sharding
                    .per_shard
                    .iter()
                    .map(|shard| of(shard).to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            writeln!(
                out,
                "  {} shards ({} hash of the user id), each its own statistic; users per shard {}; rows {}; asked {}",
                sharding.count,
                sharding.assignment,
                list(|shard| shard.users.len()),
                list(|shard| shard.rows),
                list(|shard| shard.asked)
            )?;
        }
        writeln!(
            out,
            "  asked {}; not asked: {} abstention, {} without evidence, {} with only unresolved evidence",
            c.asked, c.abstention, c.without_evidence, c.evidence_unresolved
        )?;
        for (label, notes) in [
            ("evidence strings naming no turn", &self.unresolved_evidence),
            ("evidence turns with no stored row", &self.unstored_evidence),
        ] {
            write!(out, "  {label}: {}", notes.len())?;
            for note in notes {
                write!(
                    out,
                    "; {} question {} {:?}",
                    note.user, note.question, note.evidence
                )?;
            }
            writeln!(out)?;
        }
        systems(
            out,
            "overall",
            [
                &self.overall,
                &self.bm25,
                &self.isolated,
                &self.isolated_bm25,
            ],
        )?;
        if by_category {
            for (category, ours) in &self.by_category {
                systems(
                    out,
                    &format!("category {}", self.category_label(category)),
                    [
                        ours,
                        &self.bm25_by_category[category],
                        &self.isolated_by_category[category],
                        &self.isolated_bm25_by_category[category],
                    ],
                )?;
            }
        }
        let (even, odd) = (&self.halves.even, &self.halves.odd);
        table(
            out,
            &format!(
                "halves, turn level: {} questions of even users, {} of odd users",
                even.overall.turn.questions(),
                odd.overall.turn.questions()
            ),
            &["even ours", "even BM25", "odd ours", "odd BM25"],
            &[
                &even.overall.turn,
                &even.bm25.turn,
                &odd.overall.turn,
                &odd.bm25.turn,
            ],
        )?;
        let frame = &self.overall.frame;
        match (
            frame.evidence_in_frame,
            frame.evidence_in_frame_or_reopen,
            frame.median_tokens,
            frame.p90_tokens,
        ) {
            (Some(share), Some(reopen), Some(median), Some(p90)) => writeln!(
                out,
                "\nframe, {} (probe mode): evidence in frame {share:.3} (or one memory_reopen away {reopen:.3}), tokens median {median}, p90 {p90}",
                self.memory_label()
            )?,
            _ => writeln!(out, "\nframe: no question with turn evidence")?,
        }
        writeln!(
            out,
            "latency, {} (prepare + search of {} rows): p50 {:.2} ms, p99 {:.2} ms",
            self.memory_label(),
            self.ranked_rows,
            self.latency_ms.p50,
            self.latency_ms.p99
        )?;
        match self.ingest_rows_per_s {
            Some(rate) => writeln!(out, "ingest: {rate:.0} rows/s")?,
            None => writeln!(out, "ingest: none (reused data directory)")?,
        }
        writeln!(
            out,
            "arena: {} rows x {} bytes = {} bytes",
            self.arena.rows, self.arena.bytes_per_row, self.arena.bytes
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EPS: f64 = 1e-12;

    #[test]
    fn recall_counts_evidence_in_the_top_k() {
        let ranked = ["a", "b", "c", "d"];
        let evidence = ["c", "a", "z"];
        assert_eq!(recall_any(&ranked, &evidence, 1), 1.0);
        assert_eq!(recall_any(&ranked, &["d"], 3), 0.0);
        assert_eq!(recall_all(&ranked, &evidence, 4), 0.0, "z is never found");
        assert_eq!(recall_all(&ranked, &["c", "a"], 2), 0.0);
        assert_eq!(recall_all(&ranked, &["c", "a"], 3), 1.0);
        assert!((recall_frac(&ranked, &evidence, 1) - 1.0 / 3.0).abs() < EPS);
        assert!((recall_frac(&ranked, &evidence, 3) - 2.0 / 3.0).abs() < EPS);
        assert!(
            (recall_frac(&ranked, &evidence, 20) - 2.0 / 3.0).abs() < EPS,
            "k past the list"
        );
    }

    #[test]
    fn ndcg_matches_hand_computation() {
        let ranked = ["a", "b", "c", "d"];
        // Evidence at ranks 2 and 4 (0-based 1 and 3): DCG = 1/log2(3) + 1/log2(5);
        // ideal: both first, 1 + 1/log2(3).
        let dcg = 1.0 / 3f64.log2() + 1.0 / 5f64.log2();
        let ideal = 1.0 + 1.0 / 3f64.log2();
        assert!((ndcg(&ranked, &["b", "d"], 4) - dcg / ideal).abs() < EPS);
        // At k = 2 only "b" counts, and the ideal holds both.
        assert!((ndcg(&ranked, &["b", "d"], 2) - (1.0 / 3f64.log2()) / ideal).abs() < EPS);
        // One evidence unit at rank 1 is perfect at any k; at rank 3, 1/log2(4) = 0.5.
        assert_eq!(ndcg(&ranked, &["a"], 1), 1.0);
        assert!((ndcg(&ranked, &["c"], 5) - 0.5).abs() < EPS);
        assert_eq!(ndcg(&ranked, &["z"], 4), 0.0);
    }

    #[test]
    fn mrr_is_the_first_evidence_rank() {
        let ranked = [7, 3, 9];
        assert_eq!(mrr(&ranked, &[9, 3]), 0.5);
        assert_eq!(mrr(&ranked, &[7]), 1.0);
        assert!((mrr(&ranked, &[9]) - 1.0 / 3.0).abs() < EPS);
        assert_eq!(mrr(&ranked, &[4]), 0.0);
    }

    #[test]
    fn question_metrics_follow_the_names() {
        let ks = [1, 3];
        let names = metric_names(&ks);
        assert_eq!(
            names,
            [
                "recall_any@1",
                "recall_all@1",
                "recall_frac@1",
                "ndcg@1",
                "recall_any@3",
                "recall_all@3",
                "recall_frac@3",
                "ndcg@3",
                "mrr"
            ]
        );
        let metrics = question_metrics(&["x", "e1", "e2"], &["e1", "e2"], &ks);
        let ideal = 1.0 + 1.0 / 3f64.log2();
        let dcg = 1.0 / 3f64.log2() + 0.5;
        let expected = [0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, dcg / ideal, 0.5];
        assert_eq!(metrics.len(), names.len());
        for (got, want) in metrics.iter().zip(expected) {
            assert!((got - want).abs() < EPS, "{metrics:?}");
        }
    }

    #[test]
    fn levels_average_and_serialize_in_order() {
        let ks = [2];
        let mut level = Level::new(&ks);
        assert_eq!(
            serde_json::to_string(&level).unwrap(),
            r#"{"questions":0,"recall_any@2":null,"recall_all@2":null,"recall_frac@2":null,"ndcg@2":null,"mrr":null}"#
        );
        level.add(&question_metrics(&["a", "b"], &["b"], &ks));
        level.add(&question_metrics(&["c", "d"], &["a", "c"], &ks));
        let means: Vec<Option<f64>> = level.means().map(|(_, m)| m).collect();
        let ndcg_b = 1.0 / 3f64.log2();
        let ndcg_c = 1.0 / (1.0 + 1.0 / 3f64.log2());
        let expected = [1.0, 0.5, 0.75, (ndcg_b + ndcg_c) / 2.0, 0.75];
        for (got, want) in means.iter().zip(expected) {
            assert!((got.unwrap() - want).abs() < EPS, "{means:?}");
        }
    }

    #[test]
    fn units_keep_their_first_rank() {
        assert_eq!(first_occurrences([3, 1, 3, 2, 1]), [3, 1, 2]);
    }

    #[test]
    fn jump_hash_matches_the_published_vectors() {
        for (key, buckets, bucket) in [
            (1, 1, 0),
            (42, 57, 43),
            (0xDEAD_10CC, 1, 0),
            (0xDEAD_10CC, 666, 361),
            (256, 1024, 520),
        ] {
            assert_eq!(jump_hash(key, buckets), bucket, "{key} over {buckets}");
        }
    }

    #[test]
    fn a_user_stays_or_moves_to_the_new_shard() {
        for i in 0..200 {
            let key = format!("user-{i}");
            assert_eq!(shard_of(&key, 1), 0);
            for n in 1..16 {
                let (before, after) = (shard_of(&key, n), shard_of(&key, n + 1));
                assert!(before < n && (after == before || after == n), "{key} {n}");
            }
        }
    }

    #[test]
    fn depths_are_sorted_and_checked() {
        assert_eq!(depths(&[10, 1, 10, 5]).unwrap(), [1, 5, 10]);
        assert!(matches!(depths(&[]), Err(EvalError::Depths { .. })));
        assert!(matches!(depths(&[0, 3]), Err(EvalError::Depths { .. })));
    }
}
