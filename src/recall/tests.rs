use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

fn rows() -> impl Strategy<Value = Vec<(RowId, u8)>> {
    proptest::collection::btree_map(0u64..200, any::<u8>(), 0..60)
        .prop_map(|m| m.into_iter().map(|(row, v)| (RowId(row), v)).collect())
}

/// Search hits as the search returns them (best first, ties by row id; some scores below
/// zero), each with a conversation and its speaker.
fn hits() -> impl Strategy<Value = (Vec<Retrieved>, Vec<u64>, Vec<Speaker>)> {
    let hit = (-4i8..16, 0u64..4, any::<bool>(), any::<bool>());
    proptest::collection::btree_map(0u64..500, hit, 0..60).prop_map(|rows| {
        let mut hits: Vec<(Retrieved, u64, Speaker)> = rows
            .into_iter()
            .map(|(row, (score, conversation, named, model))| {
                let hit = Retrieved {
                    row: RowId(row),
                    user: UserId(1),
                    score: f32::from(score) / 16.0,
                };
                (hit, conversation, Speaker { named, model })
            })
            .collect();
        hits.sort_by(|a, b| b.0.score.total_cmp(&a.0.score).then(a.0.row.cmp(&b.0.row)));
        let conversations = hits.iter().map(|h| h.1).collect();
        let speakers = hits.iter().map(|h| h.2).collect();
        (
            hits.into_iter().map(|h| h.0).collect(),
            conversations,
            speakers,
        )
    })
}

proptest! {
    /// Without lifts the frame's order is the search's.
    #[test]
    fn frame_order_without_lifts_is_the_search_order((found, conversations, speakers) in hits()) {
        let config = RecallConfig {
            conversation_lift: 0.0,
            speaker_lift: 0.0,
            model_weight: 1.0,
            ..RecallConfig::default()
        };
        prop_assert_eq!(frame_order(found.clone(), &conversations, &speakers, &config), found);
    }

    /// Each row's score is its own (a share `model_weight` of it for the model's positive
    /// ones) plus the lifts, the order is by that score then row id, and the best hit of each
    /// conversation keeps its lead over the rest of it among rows of speakers alike.
    #[test]
    fn frame_order_weighs_the_model_and_lifts_by_conversation_and_speaker(
        (found, conversations, speakers) in hits(),
        conversation_lift in 0.0f32..2.0,
        speaker_lift in 0.0f32..0.5,
        model_weight in 0.0f32..=1.0,
    ) {
        let config = RecallConfig {
            conversation_lift,
            speaker_lift,
            model_weight,
            ..RecallConfig::default()
        };
        let ordered = frame_order(found.clone(), &conversations, &speakers, &config);
        prop_assert_eq!(ordered.len(), found.len());
        let weighed = |score: f32, speaker: Speaker| {
            if speaker.model && score > 0.0 { score * model_weight } else { score }
        };
        let of: HashMap<RowId, (f32, u64, Speaker)> = found
            .iter()
            .zip(conversations.iter().zip(&speakers))
            .map(|(hit, (&conversation, &speaker))| {
                (hit.row, (weighed(hit.score, speaker), conversation, speaker))
            })
            .collect();
        for hit in &ordered {
            let (own, conversation, speaker) = of[&hit.row];
            let best = of
                .values()
                .filter(|v| v.1 == conversation)
                .map(|v| v.0)
                .fold(f32::NEG_INFINITY, f32::max);
            let lift = if speaker.named { speaker_lift } else { 0.0 };
            prop_assert_eq!(hit.score, own + conversation_lift * best + lift);
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
