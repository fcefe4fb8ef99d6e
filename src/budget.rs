//! The frame's token budget for one query, from how the retrieval scores are spread.
//!
//! The scores of the retrieved set are shifted so the lowest counts as zero, and their
//! participation ratio `n = (Σ w)² / Σ w²` counts how many matches effectively share the mass:
//! 1 when one row holds it all, every row when they score alike. The budget grows linearly
//! from the floor (`n = 1`) to the ceiling (`n` = the whole set). It decides how much is
//! rendered, never the order: nothing here reorders or rescores anything.

/// Budget bounds, in rendered tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Tokens given to a query with one dominant match.
    pub floor: usize,
    /// Tokens given to a query whose matches are dispersed; the cap of every frame.
    pub ceiling: usize,
}

impl Default for Budget {
    fn default() -> Self {
        Self {
            floor: 2_000,
            ceiling: 8_000,
        }
    }
}

/// How dispersed `scores` are, in `[0, 1]`: 0 for one dominant match (or fewer than two
/// scores, or all mass on one row), 1 when every score is alike.
pub fn spread(scores: &[f32]) -> f64 {
    if scores.len() < 2 {
        return 0.0;
    }
    let low = scores.iter().copied().fold(f32::INFINITY, f32::min);
    let high = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !(high - low).is_finite() {
        return 0.0;
    }
    if high == low {
        return 1.0;
    }
    // Summed in one fixed order, so the result does not depend on the order given.
    let mut sorted = scores.to_vec();
    sorted.sort_by(f32::total_cmp);
    let (sum, squares) = sorted.iter().fold((0f64, 0f64), |(s, q), &x| {
        let w = f64::from(x - low);
        (s + w, q + w * w)
    });
    let effective = sum * sum / squares;
    ((effective - 1.0) / (scores.len() - 1) as f64).clamp(0.0, 1.0)
}

impl Budget {
    /// The token budget for a query whose retrieved rows scored `scores`.
    pub fn tokens(&self, scores: &[f32]) -> usize {
        let room = self.ceiling.saturating_sub(self.floor) as f64;
        self.floor.min(self.ceiling) + (room * spread(scores)).round() as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const BUDGET: Budget = Budget {
        floor: 1_000,
        ceiling: 8_000,
    };

    fn scores() -> impl Strategy<Value = Vec<f32>> {
        proptest::collection::vec(0.0f32..10.0, 2..200)
    }

    #[test]
    fn one_dominant_match_gets_the_floor_and_alike_matches_the_ceiling() {
        let mut dominant = vec![0.0f32; 50];
        dominant[0] = 9.0;
        assert_eq!(BUDGET.tokens(&dominant), BUDGET.floor);
        assert_eq!(BUDGET.tokens(&[2.0; 50]), BUDGET.ceiling);
        assert_eq!(BUDGET.tokens(&[]), BUDGET.floor);
        assert_eq!(BUDGET.tokens(&[3.0]), BUDGET.floor);
    }

    #[test]
    fn two_strong_matches_get_less_than_ten() {
        let mut two = vec![0.0f32; 50];
        two[..2].fill(5.0);
        let mut ten = vec![0.0f32; 50];
        ten[..10].fill(5.0);
        let (a, b) = (BUDGET.tokens(&two), BUDGET.tokens(&ten));
        assert!(BUDGET.floor < a && a < b && b < BUDGET.ceiling, "{a} {b}");
    }

    proptest! {
        #[test]
        fn the_budget_stays_within_its_bounds(s in scores()) {
            let tokens = BUDGET.tokens(&s);
            prop_assert!((BUDGET.floor..=BUDGET.ceiling).contains(&tokens));
        }

        #[test]
        fn a_more_dominant_top_match_never_gets_more(s in scores(), lift in 0.0f32..20.0) {
            let top = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut lifted = s.clone();
            let at = s.iter().position(|&x| x == top).unwrap();
            lifted[at] = top + lift;
            prop_assert!(BUDGET.tokens(&lifted) <= BUDGET.tokens(&s));
        }

        #[test]
        fn more_equal_matches_never_get_less(n in 2usize..200, k in 1usize..200, top in 0.1f32..10.0) {
            let k = k.min(n - 1);
            let with = |k: usize| {
                let mut s = vec![0.0f32; n];
                s[..k].fill(top);
                BUDGET.tokens(&s)
            };
            prop_assert!(with(k + 1) >= with(k));
        }

        #[test]
        fn the_order_of_scores_does_not_matter(s in scores()) {
            let mut reversed = s.clone();
            reversed.reverse();
            prop_assert_eq!(BUDGET.tokens(&reversed), BUDGET.tokens(&s));
        }
    }
}
