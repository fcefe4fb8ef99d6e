use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

fn rows() -> impl Strategy<Value = Vec<(RowId, u8)>> {
    proptest::collection::btree_map(0u64..200, any::<u8>(), 0..60)
        .prop_map(|m| m.into_iter().map(|(row, v)| (RowId(row), v)).collect())
}

/// Search hits as the search returns them (best first, ties by row id), each with a
/// conversation and whether its speaker is named.
fn hits() -> impl Strategy<Value = (Vec<Retrieved>, Vec<u64>, Vec<bool>)> {
    proptest::collection::btree_map(0u64..500, (0u8..16, 0u64..4, any::<bool>()), 0..60).prop_map(
        |rows| {
            let mut hits: Vec<(Retrieved, u64, bool)> = rows
                .into_iter()
                .map(|(row, (score, conversation, named))| {
                    let hit = Retrieved {
                        row: RowId(row),
                        user: UserId(1),
                        score: f32::from(score) / 16.0,
                    };
                    (hit, conversation, named)
                })
                .collect();
            hits.sort_by(|a, b| b.0.score.total_cmp(&a.0.score).then(a.0.row.cmp(&b.0.row)));
            let conversations = hits.iter().map(|h| h.1).collect();
            let named = hits.iter().map(|h| h.2).collect();
            (
                hits.into_iter().map(|h| h.0).collect(),
                conversations,
                named,
            )
        },
    )
}

proptest! {
    /// Without lifts the frame's order is the search's.
    #[test]
    fn frame_order_without_lifts_is_the_search_order((found, conversations, named) in hits()) {
        let config = RecallConfig {
            conversation_lift: 0.0,
            speaker_lift: 0.0,
            ..RecallConfig::default()
        };
        prop_assert_eq!(frame_order(found.clone(), &conversations, &named, &config), found);
    }

    /// Each row's score is its own plus the lifts, the order is by that score then row id,
    /// and the best hit of each conversation keeps its lead over the rest of it among rows
    /// named alike.
    #[test]
    fn frame_order_lifts_by_conversation_and_speaker(
        (found, conversations, named) in hits(),
        conversation_lift in 0.0f32..2.0,
        speaker_lift in 0.0f32..0.5,
    ) {
        let config = RecallConfig { conversation_lift, speaker_lift, ..RecallConfig::default() };
        let ordered = frame_order(found.clone(), &conversations, &named, &config);
        prop_assert_eq!(ordered.len(), found.len());
        let of: HashMap<RowId, (f32, u64, bool)> = found
            .iter()
            .zip(conversations.iter().zip(&named))
            .map(|(hit, (&conversation, &named))| (hit.row, (hit.score, conversation, named)))
            .collect();
        for hit in &ordered {
            let (own, conversation, named) = of[&hit.row];
            let best = of
                .values()
                .filter(|v| v.1 == conversation)
                .map(|v| v.0)
                .fold(f32::NEG_INFINITY, f32::max);
            let expected = own + conversation_lift * best + if named { speaker_lift } else { 0.0 };
            prop_assert_eq!(hit.score, expected);
        }
        for pair in ordered.windows(2) {
            prop_assert!(
                pair[0].score > pair[1].score
                    || (pair[0].score == pair[1].score && pair[0].row < pair[1].row)
            );
            let (a, b) = (of[&pair[0].row], of[&pair[1].row]);
            if a.1 == b.1 && a.2 == b.2 {
                prop_assert!(a.0 >= b.0);
            }
        }
    }

    /// The merge is the map that takes the second list's entries where the first lacks
    /// the row, in row order.
    #[test]
    fn merge_by_row_keeps_each_row_once_the_first_lists_entry_first(first in rows(), second in rows()) {
        let mut expected: BTreeMap<RowId, u8> = second.iter().copied().collect();
        expected.extend(first.iter().copied());
        let merged = merge_by_row(first, second);
        prop_assert_eq!(merged, expected.into_iter().collect::<Vec<_>>());
    }
}
