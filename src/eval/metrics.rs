//! The ranked-retrieval metrics (recall_any, recall_all, recall_frac, NDCG at each depth, MRR)
//! and their means over questions.

use super::*;

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
pub(super) fn first_occurrences<T: Eq + Hash + Clone>(
    items: impl IntoIterator<Item = T>,
) -> Vec<T> {
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
    pub(super) ks: Vec<usize>,
    pub(super) questions: usize,
    pub(super) sums: Vec<f64>,
}

impl Level {
    pub(super) fn new(ks: &[usize]) -> Self {
        Self {
            ks: ks.to_vec(),
            questions: 0,
            sums: vec![0.0; ks.len() * PER_K.len() + 1],
        }
    }

    pub(super) fn add(&mut self, metrics: &[f64]) {
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

pub(super) fn summarize<'a>(ks: &[usize], scores: impl Iterator<Item = &'a Scored>) -> Summary {
    let (mut turn, mut session, mut retrieved) = (Level::new(ks), Level::new(ks), Level::new(ks));
    let (mut in_frame, mut with_reopen) = (Vec::new(), Vec::new());
    let (mut tokens, mut retrieved_tokens) = (Vec::new(), Vec::new());
    for scored in scores {
        if let Some(metrics) = &scored.turn {
            turn.add(metrics);
        }
        if let Some(metrics) = &scored.session {
            session.add(metrics);
        }
        if let Some(frame) = &scored.frame {
            in_frame.extend(frame.all_in);
            with_reopen.extend(frame.with_reopen);
            if let Some(metrics) = &frame.retrieved {
                retrieved.add(metrics);
            }
            tokens.push(frame.tokens as u64);
            retrieved_tokens.push(frame.retrieved_tokens as u64);
        }
    }
    tokens.sort_unstable();
    retrieved_tokens.sort_unstable();
    let quantile = |sorted: &[u64], q: f64| {
        (!sorted.is_empty()).then(|| sorted[((sorted.len() - 1) as f64 * q).round() as usize])
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
            median_tokens: quantile(&tokens, 0.5),
            p90_tokens: quantile(&tokens, 0.9),
            median_retrieved_tokens: quantile(&retrieved_tokens, 0.5),
            retrieved_turn: (retrieved.questions() > 0).then_some(retrieved),
        },
    }
}

/// The depths sorted, without repeats; refused when empty or holding a zero.
pub(super) fn depths(ks: &[usize]) -> Result<Vec<usize>, EvalError> {
    if ks.is_empty() || ks.contains(&0) {
        return Err(EvalError::Depths { ks: ks.to_vec() });
    }
    let mut ks = ks.to_vec();
    ks.sort_unstable();
    ks.dedup();
    Ok(ks)
}
