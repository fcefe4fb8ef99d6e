//! Activation maths. Heat decides what the frame shows; it never enters the relevance score
//! (nothing in `relevance` or the scan imports this module).
//!
//! A row's state is `(last_clock, peak, decay)`. Its warmth at clock `t` is
//! `peak · exp(−decay · (t − last_clock))`, computed on demand and never written, so cooling
//! costs nothing. The clock counts tokens the agent processed; an idle agent forgets nothing.

use crate::store::Activation;

/// Heat of a newly captured row: creation is an activation, so every row is born hot.
pub const BORN_PEAK: f32 = 1.0;

/// Clock distance, in tokens, over which an unreheated row's warmth halves. About fifty
/// typical chat turns of a few hundred tokens each.
pub const HALF_LIFE_TOKENS: f32 = 20_000.0;

/// The decay constant fixed at a row's birth (per token of clock).
pub fn birth_decay() -> f32 {
    std::f32::consts::LN_2 / HALF_LIFE_TOKENS
}

/// Warmth of `state` at clock `now` (a clock before the last activation counts as no time).
pub fn warmth(state: &Activation, now: u64) -> f32 {
    let elapsed = now.saturating_sub(state.last_clock) as f32;
    state.peak * (-state.decay * elapsed).exp()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmth_halves_every_half_life_and_idle_time_costs_nothing() {
        let born = Activation {
            last_clock: 1_000,
            peak: BORN_PEAK,
            decay: birth_decay(),
        };
        assert_eq!(warmth(&born, 1_000), BORN_PEAK);
        assert_eq!(warmth(&born, 10), BORN_PEAK);
        let half = warmth(&born, 1_000 + HALF_LIFE_TOKENS as u64);
        assert!((half - 0.5).abs() < 1e-4, "{half}");
        let quarter = warmth(&born, 1_000 + 2 * HALF_LIFE_TOKENS as u64);
        assert!((quarter - 0.25).abs() < 1e-4, "{quarter}");
    }
}
