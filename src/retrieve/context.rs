//! A row in context: the turns around it in its conversation, whose scores lift its own
//! ([`crate::relevance::in_context`]).

use super::*;

/// The neighbours of the row in `slot` in its conversation towards `side`, nearest first,
/// up to `steps` of them ([`Arena::neighbour`] followed `steps` times at most, stopping at the
/// first gap).
pub(super) fn walk<const N: usize>(
    arena: &Arena,
    slot: Slot,
    side: Side,
    steps: usize,
) -> [Option<Slot>; N] {
    let mut out = [None; N];
    let mut at = slot;
    for place in out.iter_mut().take(steps) {
        match arena.neighbour(at, side) {
            Some(next) => {
                *place = Some(next);
                at = next;
            }
            None => break,
        }
    }
    out
}

pub(super) fn context(arena: &Arena, slot: Slot) -> Context {
    let before: [Option<Slot>; CONTEXT_BEFORE.len()] =
        walk(arena, slot, Side::Before, CONTEXT_BEFORE.len());
    let read = before.iter().map_while(|s| *s).count();
    let after = walk(arena, slot, Side::After, after_shares(read).len());
    (before, after)
}

/// [`in_context`] of a row with own score `own` and neighbours `context`, each neighbour's own
/// score read through `own_of`.
pub(super) fn score_in_context(own: f32, context: &Context, own_of: impl Fn(Slot) -> f32) -> f32 {
    fn scores<const N: usize>(
        slots: &[Option<Slot>; N],
        own_of: &impl Fn(Slot) -> f32,
    ) -> ([f32; N], usize) {
        let mut out = [0f32; N];
        let mut n = 0;
        for slot in slots.iter().map_while(|s| *s) {
            out[n] = own_of(slot);
            n += 1;
        }
        (out, n)
    }
    let (before, b) = scores(&context.0, &own_of);
    let (after, a) = scores(&context.1, &own_of);
    in_context(own, &before[..b], &after[..a])
}

/// The rows whose score in context reads the row in `slot` ([`context`] the other way): the
/// rows up to `CONTEXT_BEFORE.len()` after it, the one before it, and an opening up to
/// `OPENING_AFTER.len()` before it.
pub(super) fn read_by(arena: &Arena, slot: Slot) -> impl Iterator<Item = Slot> {
    let after: [Option<Slot>; CONTEXT_BEFORE.len()] =
        walk(arena, slot, Side::After, CONTEXT_BEFORE.len());
    let before: [Option<Slot>; OPENING_AFTER.len()] =
        walk(arena, slot, Side::Before, OPENING_AFTER.len());
    let reads = move |(distance, row): (usize, Slot)| {
        distance < CONTEXT_AFTER.len() || arena.neighbour(row, Side::Before).is_none()
    };
    after.into_iter().flatten().chain(
        before
            .into_iter()
            .map_while(|s| s)
            .enumerate()
            .filter(move |&pair| reads(pair))
            .map(|(_, row)| row),
    )
}

/// `slots` and the rows `around` gives for each, once each, in row id order.
pub(super) fn with_rows_around<I: Iterator<Item = Slot>>(
    arena: &Arena,
    slots: impl IntoIterator<Item = Slot>,
    around: impl Fn(Slot) -> I,
) -> Vec<(RowId, Slot)> {
    let mut out: Vec<(RowId, Slot)> = slots
        .into_iter()
        .flat_map(|slot| std::iter::once(slot).chain(around(slot)))
        .map(|slot| (row_in(arena, slot), slot))
        .collect();
    out.sort_unstable_by_key(|&(row, _)| row);
    out.dedup_by_key(|&mut (row, _)| row);
    out
}
