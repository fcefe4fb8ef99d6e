//! One question asked: its evidence turns, the pooled corpus it is scored against, the probe
//! search and frame, and the scores of each system.

use super::*;

/// A retrieved row's turn: the file's turn id, or for a row captured without one, its message.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Turn {
    Source(String),
    Unlabelled(RowId),
}

/// A question's evidence turns as the ranked units name them.
pub(super) fn evidence_turns(question: &Question) -> Vec<Turn> {
    question
        .evidence_turns
        .iter()
        .map(|id| Turn::Source(id.clone()))
        .collect()
}

/// A ranked answer at both levels, best first, each unit at its first occurrence.
#[derive(Debug, Clone)]
pub(super) struct Ranked {
    pub(super) turns: Vec<Turn>,
    pub(super) sessions: Vec<String>,
}

/// What one memory returned for one question: ours and the baseline.
#[derive(Debug, Clone)]
pub(super) struct Answers {
    pub(super) ours: Ranked,
    pub(super) bm25: Ranked,
    /// Ours as the frame showed it, where a frame was rendered.
    pub(super) frame: Option<Shown>,
    /// Prepare + search of ours.
    pub(super) elapsed: Duration,
}

/// The turns a rendered frame shows, its tokens, the turns one `memory_reopen` after it
/// returns (the retrieved set's turns the frame left out), and the retrieved set's turns in
/// the frame's order (the search's rows, the model's weighed and each lifted by its
/// conversation and speaker, with the openings: what the reheat ranks and `memory_reopen`
/// pages through).
#[derive(Debug, Clone)]
pub(super) struct Shown {
    pub(super) turns: HashSet<Turn>,
    pub(super) tokens: usize,
    /// The frame's tokens less its messages that quote only the current conversation's own
    /// stretch: what the retrieved memory costs.
    pub(super) retrieved_tokens: usize,
    pub(super) reopened: HashSet<Turn>,
    pub(super) retrieved: Vec<Turn>,
}

/// What the harness reads of one store: each row's turn and session, and each asked user's
/// retrieval rows for the baseline, read as the store grows ([`Corpus::catch_up`]).
#[derive(Default)]
pub(super) struct Corpus {
    pub(super) units: HashMap<RowId, (Turn, String)>,
    pub(super) rows: HashMap<UserId, Vec<(RowId, RetrievalRow)>>,
    pub(super) stored_turns: HashSet<(UserId, String)>,
    /// Each user's latest turn time: the "now" a probe's frame is rendered at.
    pub(super) latest: HashMap<UserId, i64>,
    /// Rows from here on are not read yet.
    pub(super) next: RowId,
}

impl Corpus {
    /// Read the rows of `users` captured since the last call.
    pub(super) fn catch_up(
        &mut self,
        store: &Store,
        users: &HashSet<UserId>,
    ) -> Result<(), EvalError> {
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

    /// The baseline: every row of `user` but those `passed_over` scored by plain BM25 under
    /// the statistic `stats`, the best `depth` by score descending, then row id ascending.
    fn bm25(
        &self,
        stats: &FrequencyTable,
        user: UserId,
        query: &RetrievalRow,
        depth: usize,
        passed_over: &HashSet<RowId>,
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
            .filter(|(id, _)| !passed_over.contains(id))
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
pub(super) struct Probe<'a> {
    pub(super) store: &'a Store,
    /// The recall's settings: how much of a question's conversation it is read beside, and
    /// passes over.
    pub(super) recall: RecallConfig,
    pub(super) dictionary: &'a Dictionary,
    pub(super) arena: &'a Arena,
    pub(super) kernels: &'a Kernels,
    pub(super) corpus: &'a Corpus,
    pub(super) frame: Option<(&'a Memory, &'a RecallConfig)>,
}

impl Probe<'_> {
    /// Ask one question as its user, in probe mode (nothing is captured), both ways.
    pub(super) fn ask(&self, question: &Question, depth: usize) -> Result<Answers, StoreError> {
        let user = UserId::from_key(&question.user_key);
        let ask = Ask {
            user,
            scope: &[user],
            conversation: question.conversation.as_deref(),
            question: &question.question,
            probe: true,
            hidden: &[],
            now_ms: self.corpus.latest.get(&user).copied(),
            pin: None,
            sent_tokens: None,
        };
        // Read as the recall reads it: beside its conversation's stretch, which both systems
        // pass over (the frame holds it whatever is found).
        let stretch = stretch(self.store, self.arena, &ask, &self.recall, &HashSet::new())?;
        let passed_over: HashSet<RowId> = stretch.ids().collect();
        let started = Instant::now();
        let query = question_query(
            self.dictionary,
            self.arena,
            &ask,
            &stretch.rows[..stretch.recent],
        );
        let hits = search_without(
            self.dictionary,
            self.arena,
            self.kernels,
            &[user],
            &query,
            depth,
            &passed_over,
        );
        let elapsed = started.elapsed();
        let frame = match self.frame {
            Some((memory, config)) => {
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
                        &recall.frame.whole_rows(),
                    );
                    turns_of(
                        &state
                            .run(memory, self.arena, self.kernels, &Call::Reopen)?
                            .rows,
                    )
                };
                let stretch_tokens: usize = recall
                    .frame
                    .messages
                    .iter()
                    .filter(|m| {
                        !m.rows.is_empty() && m.rows.iter().all(|r| passed_over.contains(r))
                    })
                    .map(|m| m.tokens)
                    .sum();
                Some(Shown {
                    turns,
                    tokens: recall.frame.tokens,
                    retrieved_tokens: recall.frame.tokens.saturating_sub(stretch_tokens),
                    reopened,
                    retrieved: self
                        .corpus
                        .ranked(recall.retrieved.iter().map(|r| RowId(r.row)))
                        .turns,
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
                &passed_over,
            )),
            elapsed,
        })
    }
}

/// One question's frame: whether every evidence turn was shown, and whether every one was
/// shown or returned by one `memory_reopen`, and the turn-level metrics of the retrieved set
/// in the frame's order (`None` without turn evidence); the frame's tokens.
#[derive(Debug, Clone)]
pub(super) struct FrameScore {
    pub(super) all_in: Option<bool>,
    pub(super) with_reopen: Option<bool>,
    pub(super) retrieved: Option<Vec<f64>>,
    pub(super) tokens: usize,
    pub(super) retrieved_tokens: usize,
}

/// One question's metrics at both levels (`None` where it has no evidence at that level), and
/// its frame's.
#[derive(Debug, Clone)]
pub(super) struct Scored {
    pub(super) turn: Option<Vec<f64>>,
    pub(super) session: Option<Vec<f64>>,
    pub(super) frame: Option<FrameScore>,
}

impl Scored {
    pub(super) fn new(
        question: &Question,
        ranked: &Ranked,
        frame: Option<&Shown>,
        ks: &[usize],
    ) -> Self {
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
                    retrieved: (!turns.is_empty())
                        .then(|| question_metrics(&shown.retrieved, &turns, ks)),
                    tokens: shown.tokens,
                    retrieved_tokens: shown.retrieved_tokens,
                }
            }),
        }
    }
}

/// Every asked question's scores under the four systems.
pub(super) struct Outcome<'a> {
    pub(super) question: &'a Question,
    /// 0 for an even-indexed user, 1 for an odd one.
    pub(super) half: usize,
    pub(super) ours: Scored,
    pub(super) bm25: Scored,
    pub(super) isolated: Scored,
    pub(super) isolated_bm25: Scored,
}
