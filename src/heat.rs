//! Activation maths. Heat decides what the frame shows; it never enters the relevance score
//! (nothing in `relevance` or the scan imports this module).
//!
//! A row's state is `(last_clock, peak, decay)`. Its warmth at clock `t` is
//! `peak · exp(−decay · (t − last_clock))`, computed on demand and never written, so cooling
//! costs nothing. The clock counts tokens the agent processed; an idle agent forgets nothing.
//!
//! Three things set a state, and only these:
//! - birth ([`born`]): peak [`BORN_PEAK`] at the capture's clock, with a decay fixed from the
//!   row's novelty ([`birth_decay`]) and never rewritten;
//! - retrieval's reheat ([`reheat`]): a peak shaped by rank ([`reheat_peak`]), adopted only where
//!   the new trajectory beats the current one at the current clock. Both trajectories share the
//!   row's decay, so a trajectory that is higher now stays higher at every later clock.

use crate::dictionary::Dictionary;
use crate::dictionary::derive::token_weight;
use crate::dictionary::stats::FrequencyTable;
use crate::store::Activation;
use crate::types::TokenId;

/// Heat of a newly captured row: creation is an activation, so every row is born hot.
pub const BORN_PEAK: f32 = 1.0;

/// Clock distance, in tokens, over which the warmth of an unreheated row of middling novelty
/// (0.5) halves: about fifty chat turns of a few hundred tokens each.
pub const HALF_LIFE_TOKENS: f32 = 20_000.0;

/// The peak a reheat gives the top-ranked row, above [`BORN_PEAK`] so that what retrieval
/// selected this turn outranks what was merely said recently.
pub const REHEAT_TOP_PEAK: f32 = 3.0;

/// Rank at which a reheat's boost over [`BORN_PEAK`] has halved.
pub const REHEAT_RANK_SCALE: f32 = 16.0;

/// Novelty of a row at birth, in `[0, 1]`: the mean SIF weight `a / (a + p(t))` of its tokens
/// under the dictionary's prior (the frequency statistic a row is born under, before any memory
/// has counted anything). Filler ("ok, thanks!") is made of common tokens and scores low; names,
/// numbers and rare words score high. An empty row has novelty 0.
pub fn novelty(dictionary: &Dictionary, tokens: &[TokenId]) -> f32 {
    if tokens.is_empty() {
        return 0.0;
    }
    let prior_only = FrequencyTable::default();
    let sum: f32 = tokens
        .iter()
        .map(|&token| token_weight(dictionary, &prior_only, token))
        .sum();
    (sum / tokens.len() as f32).clamp(0.0, 1.0)
}

/// The decay constant fixed at a row's birth (per token of clock), from its novelty: the
/// half-life runs from half of [`HALF_LIFE_TOKENS`] (novelty 0) to one and a half of it
/// (novelty 1), so novel rows stay warm longer than filler.
pub fn birth_decay(novelty: f32) -> f32 {
    let half_life = HALF_LIFE_TOKENS * (0.5 + novelty.clamp(0.0, 1.0));
    std::f32::consts::LN_2 / half_life
}

/// The clock distance beyond which no row that was only born (never reheated) is still at
/// `floor` warmth: birth at [`BORN_PEAK`] under the slowest decay (novelty 1).
pub fn born_reach(floor: f32) -> u64 {
    if floor <= 0.0 {
        return u64::MAX;
    }
    ((BORN_PEAK / floor).ln().max(0.0) / birth_decay(1.0)).ceil() as u64
}

/// The state of a row born at clock `clock` with decay `decay`.
pub fn born(clock: u64, decay: f32) -> Activation {
    Activation {
        last_clock: clock,
        peak: BORN_PEAK,
        decay,
    }
}

/// Warmth of `state` at clock `now` (a clock before the last activation counts as no time).
pub fn warmth(state: &Activation, now: u64) -> f32 {
    let elapsed = now.saturating_sub(state.last_clock) as f32;
    state.peak * (-state.decay * elapsed).exp()
}

/// The peak a reheat gives the row retrieved at `rank` (0 = best): from [`REHEAT_TOP_PEAK`]
/// down towards [`BORN_PEAK`], strictly decreasing with rank and always above it.
pub fn reheat_peak(rank: usize) -> f32 {
    BORN_PEAK + (REHEAT_TOP_PEAK - BORN_PEAK) / (1.0 + rank as f32 / REHEAT_RANK_SCALE)
}

/// The state after retrieval selected the row at `rank` at clock `now`: the new trajectory
/// where it beats the current one at `now`, else `None` (the current one stands).
pub fn reheat(current: &Activation, now: u64, rank: usize) -> Option<Activation> {
    let peak = reheat_peak(rank);
    (peak > warmth(current, now)).then_some(Activation {
        last_clock: now.max(current.last_clock),
        peak,
        decay: current.decay,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn state() -> impl Strategy<Value = Activation> {
        (0u64..1_000_000, 0.01f32..4.0, 0.0f32..1.0).prop_map(|(last_clock, peak, novelty)| {
            Activation {
                last_clock,
                peak,
                decay: birth_decay(novelty),
            }
        })
    }

    #[test]
    fn warmth_halves_every_half_life_and_idle_time_costs_nothing() {
        let born = born(1_000, birth_decay(0.5));
        assert_eq!(warmth(&born, 1_000), BORN_PEAK);
        assert_eq!(warmth(&born, 10), BORN_PEAK);
        let half = warmth(&born, 1_000 + HALF_LIFE_TOKENS as u64);
        assert!((half - 0.5).abs() < 1e-4, "{half}");
        let quarter = warmth(&born, 1_000 + 2 * HALF_LIFE_TOKENS as u64);
        assert!((quarter - 0.25).abs() < 1e-4, "{quarter}");
    }

    #[test]
    fn novel_rows_decay_slower_than_filler() {
        assert!(birth_decay(1.0) < birth_decay(0.5));
        assert!(birth_decay(0.5) < birth_decay(0.0));
        assert_eq!(birth_decay(2.0), birth_decay(1.0));
    }

    #[test]
    fn beyond_the_born_reach_no_born_row_is_warm_enough() {
        for floor in [0.01f32, 0.05, 0.5] {
            let reach = born_reach(floor);
            for novelty in [0.0f32, 0.5, 1.0] {
                let row = born(0, birth_decay(novelty));
                assert!(warmth(&row, reach + 1) < floor, "{floor} {novelty}");
            }
            assert!(warmth(&born(0, birth_decay(1.0)), reach - reach / 100) >= floor);
        }
    }

    #[test]
    fn reheat_peaks_fall_with_rank_and_stay_above_birth() {
        assert_eq!(reheat_peak(0), REHEAT_TOP_PEAK);
        for rank in 0..1_000 {
            assert!(reheat_peak(rank + 1) < reheat_peak(rank));
            assert!(reheat_peak(rank) > BORN_PEAK);
        }
    }

    proptest! {
        #[test]
        fn warmth_decreases_between_activations(s in state(), a in 0u64..100_000, b in 0u64..100_000) {
            let (early, late) = (s.last_clock + a.min(b), s.last_clock + a.max(b));
            prop_assert!(warmth(&s, late) <= warmth(&s, early));
            prop_assert!(warmth(&s, early) <= s.peak);
        }

        #[test]
        fn a_clock_that_has_not_advanced_cools_nothing(s in state(), back in 0u64..1_000_000) {
            prop_assert_eq!(warmth(&s, s.last_clock), s.peak);
            prop_assert_eq!(warmth(&s, s.last_clock.saturating_sub(back)), s.peak);
        }

        #[test]
        fn reheat_never_lowers_the_trajectory(
            s in state(),
            rank in 0usize..500,
            since in 0u64..200_000,
            later in 0u64..1_000_000,
        ) {
            let now = s.last_clock + since;
            match reheat(&s, now, rank) {
                Some(next) => {
                    prop_assert_eq!(next.decay, s.decay);
                    for t in [now, now + later] {
                        prop_assert!(warmth(&next, t) >= warmth(&s, t));
                    }
                    prop_assert!(warmth(&next, now) > warmth(&s, now));
                }
                None => prop_assert!(warmth(&s, now) >= reheat_peak(rank)),
            }
        }
    }
}
