//! The report: what `eval --json` prints (names in `docs/eval.md`) and its rendering as tables.

use super::*;

/// Frame metrics of ours, pooled (`null` for the other systems): the share of questions whose
/// every evidence turn is inside the rendered frame, the share whose every evidence turn is in
/// the frame or in what one `memory_reopen` returns after it, the frame's size in tokens, and
/// the turn level of the retrieved set in the frame's order (the search's rows, the model's
/// weighed and each lifted by its conversation and speaker, with the openings: what the
/// reheat ranks and `memory_reopen` pages through), beside the search's own order in `turn`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FrameMetrics {
    pub evidence_in_frame: Option<f64>,
    pub evidence_in_frame_or_reopen: Option<f64>,
    pub median_tokens: Option<u64>,
    pub p90_tokens: Option<u64>,
    /// The median of the frame's tokens less the current conversation's own stretch.
    pub median_retrieved_tokens: Option<u64>,
    pub retrieved_turn: Option<Level>,
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
    pub(super) fn new(index: usize, question: &Question, answers: &Answers) -> Self {
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
    /// Records of the file that could not be read and were left out, each named with why.
    pub skipped_records: Vec<String>,
    /// Evidence strings that name no turn of their conversation.
    pub unresolved_evidence: Vec<EvidenceNote>,
    /// Evidence turns the pooled memory holds no row for.
    pub unstored_evidence: Vec<EvidenceNote>,
    /// Every asked question's ranks, in the file's order (not in `--json`; `--per-question`
    /// writes them).
    #[serde(skip)]
    pub per_question: Vec<QuestionRanks>,
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
        write!(out, "  records skipped: {}", self.skipped_records.len())?;
        for record in &self.skipped_records {
            write!(out, "; {record}")?;
        }
        writeln!(out)?;
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
                "\nframe, {} (probe mode): evidence in frame {share:.3} (or one memory_reopen away {reopen:.3}), tokens median {median}, p90 {p90}, retrieved memory median {}",
                self.memory_label(),
                frame.median_retrieved_tokens.unwrap_or(0)
            )?,
            _ => writeln!(out, "\nframe: no question with turn evidence")?,
        }
        if let Some(retrieved) = &frame.retrieved_turn {
            table(
                out,
                "turn level, the search's order against the retrieved set in the frame's order (weight, lifts and openings)",
                &["search", "frame's order"],
                &[&self.overall.turn, retrieved],
            )?;
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
