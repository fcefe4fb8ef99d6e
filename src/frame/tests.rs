use super::*;
use proptest::prelude::*;

const MINUTE: i64 = 60_000;
const DAY: i64 = 24 * 60 * MINUTE;
/// 2023-05-08 13:56 UTC.
const MAY_8: i64 = 1_683_554_160_000;

fn words(text: &str) -> usize {
    text.split_whitespace().count()
}

fn turn(row: u64, conversation: &str, role: Role, speaker: &str, text: &str) -> Turn {
    Turn {
        row: RowId(row),
        conversation: conversation.to_owned(),
        message: RowId(row),
        chunk: 0,
        chunks: 1,
        role,
        speaker: Some(speaker.to_owned()),
        timestamp_ms: Some(MAY_8 + row as i64 * MINUTE),
        text: text.to_owned(),
        tokens: words(text),
        quoted_whole: false,
    }
}

#[test]
fn labels_carry_name_date_and_age() {
    let t = turn(0, "s1", Role::User, "Caroline", "hi");
    assert_eq!(
        label(&t, Some(MAY_8 + 21 * DAY), None),
        "[Caroline, 2023-05-08 13:56, 3 weeks before now]"
    );
    assert_eq!(label(&t, None, None), "[Caroline, 2023-05-08 13:56]");
    assert_eq!(
        label(&t, Some(MAY_8 + 21 * DAY), Some(MAY_8 - 3 * MINUTE)),
        "[Caroline, 13:56]"
    );
    assert_eq!(
        label(&t, Some(MAY_8 + 21 * DAY), Some(MAY_8 + 30_000)),
        "[Caroline]"
    );
    assert_eq!(
        label(&t, Some(MAY_8 + 21 * DAY), Some(MAY_8 - DAY)),
        "[Caroline, 2023-05-08 13:56, 3 weeks before now]"
    );
    let anonymous = Turn {
        speaker: None,
        timestamp_ms: None,
        ..t
    };
    assert_eq!(label(&anonymous, Some(MAY_8), None), "[user]");
}

#[test]
fn ages_use_the_largest_whole_unit() {
    assert_eq!(age_label(30_000), "just now");
    assert_eq!(age_label(MINUTE), "1 minute before now");
    assert_eq!(age_label(59 * MINUTE), "59 minutes before now");
    assert_eq!(age_label(3 * 60 * MINUTE), "3 hours before now");
    assert_eq!(age_label(DAY), "1 day before now");
    assert_eq!(age_label(13 * DAY), "13 days before now");
    assert_eq!(age_label(21 * DAY), "3 weeks before now");
    assert_eq!(age_label(90 * DAY), "3 months before now");
    assert_eq!(age_label(800 * DAY), "2 years before now");
    assert_eq!(age_label(-2 * DAY), "2 days after now");
}

#[test]
fn groups_by_conversation_with_the_current_one_last_and_merges_sides() {
    let turns = [
        turn(
            1,
            "s1",
            Role::User,
            "Caroline",
            "I went to the support group.",
        ),
        turn(2, "s1", Role::Assistant, "Melanie", "How was it?"),
        turn(3, "s2", Role::User, "Caroline", "Painting today."),
        turn(4, "s2", Role::User, "Caroline", "A sunset."),
        turn(5, "s1", Role::User, "Caroline", "It was great."),
    ];
    let refs: Vec<&Turn> = turns.iter().collect();
    let layout = Layout {
        now_ms: Some(MAY_8 + 10 * MINUTE),
        current: Some("s2"),
        probe_question: Some("What did Caroline paint?"),
        tools: false,
        ..Layout::default()
    };
    let messages = render(&refs, &layout, Omitted::default());
    let shape: Vec<(Side, Vec<u64>)> = messages
        .iter()
        .map(|m| (m.role, m.rows.iter().map(|r| r.0).collect()))
        .collect();
    assert_eq!(
        shape,
        vec![
            (Side::User, vec![1]),
            (Side::Assistant, vec![2]),
            (Side::User, vec![5, 3, 4]),
        ]
    );
    assert_eq!(
        messages[0].content,
        "[Earlier conversation from 2023-05-08 13:57, 9 minutes before now]\n\n\
         [Caroline] I went to the support group."
    );
    assert_eq!(
        messages[2].content,
        "[Caroline, 14:01] It was great.\n\n\
         [This conversation from 2023-05-08 13:59]\n\n\
         [Caroline] Painting today.\n\n\
         [Caroline, 14:00] A sunset.\n\n\
         What did Caroline paint?"
    );
}

#[test]
fn a_group_opening_on_the_assistant_side_still_starts_with_a_user_message() {
    let turns = [turn(7, "s9", Role::Assistant, "Melanie", "Hello.")];
    let refs: Vec<&Turn> = turns.iter().collect();
    let messages = render(&refs, &Layout::default(), Omitted::default());
    assert_eq!(messages[0].role, Side::User);
    assert_eq!(
        messages[0].content,
        "[Earlier conversation from 2023-05-08 14:03]"
    );
    assert_eq!(messages[1].role, Side::Assistant);
}

#[test]
fn chunks_of_one_message_join_verbatim_under_one_label() {
    let mut first = turn(10, "s1", Role::User, "Ann", "Part one. ");
    let mut second = turn(11, "s1", Role::User, "Ann", "Part two.");
    first.message = RowId(10);
    second.message = RowId(10);
    second.chunk = 1;
    (first.chunks, second.chunks) = (2, 2);
    let messages = render(&[&first, &second], &Layout::default(), Omitted::default());
    assert_eq!(
        messages[0].content,
        "[Earlier conversation from 2023-05-08 14:06]\n\n[Ann] Part one. Part two."
    );
    assert_eq!(messages[0].rows, vec![RowId(10), RowId(11)]);
}

#[test]
fn a_message_shown_in_part_says_where_it_is_cut_and_where_the_whole_is() {
    // One assistant answer of four chunks, rows 30 to 33.
    let chunks: Vec<Turn> = ["One. ", "Two. ", "Three. ", "Four."]
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let mut chunk = turn(30 + i as u64, "s1", Role::Assistant, "Bot", text);
            (chunk.message, chunk.chunk, chunk.chunks) = (RowId(30), i as u16, 4);
            chunk.timestamp_ms = Some(MAY_8);
            chunk
        })
        .collect();
    let tools = Layout {
        tools: true,
        ..Layout::default()
    };
    let shown = |picked: &[usize], layout: &Layout<'_>| {
        let turns: Vec<&Turn> = picked.iter().map(|&i| &chunks[i]).collect();
        let messages = render(&turns, layout, Omitted::default());
        messages[1].content.clone()
    };
    assert_eq!(
        shown(&[0, 1, 2, 3], &tools),
        "[Bot] One. Two. Three. Four.",
        "a whole message has no mark"
    );
    assert_eq!(
        shown(&[0, 1], &tools),
        "[Bot] One. Two. … [cut here; memory_chain #30 returns the rest]"
    );
    assert_eq!(
        shown(&[2, 3], &tools),
        "[Bot] … Three. Four. [its start is cut; memory_chain #30 returns the rest]"
    );
    assert_eq!(
        shown(&[1], &Layout::default()),
        "[Bot] … Two. … [cut here; the whole is stored]"
    );
    // Two runs of one message: each says where it is cut.
    assert_eq!(
        shown(&[0, 2], &tools),
        "[Bot] One. … [cut here; memory_chain #30 returns the rest]\n\n\
         [Bot] … Three. … [cut here; memory_chain #30 returns the rest]"
    );
}

#[test]
fn the_omission_line_names_the_tool_only_when_tools_ride_along() {
    let omitted = Omitted {
        turns: 3,
        tokens: 120,
    };
    assert_eq!(
        omission_line(omitted, true),
        "[3 more remembered turns (120 tokens) did not fit in this frame; \
         memory_reopen returns them.]"
    );
    assert!(!omission_line(omitted, false).contains("memory"));
}

fn candidates() -> impl Strategy<Value = Vec<Candidate>> {
    proptest::collection::vec(
        (
            prop_oneof![4 => 1usize..60, 1 => 60usize..400],
            0.0f32..3.0,
            proptest::bool::weighted(0.15),
            0u8..3,
        ),
        1..60,
    )
    .prop_map(|specs| {
        specs
            .into_iter()
            .enumerate()
            .map(|(i, (len, warmth, mandatory, conv))| {
                let role = if i % 3 == 0 {
                    Role::Assistant
                } else {
                    Role::User
                };
                let text = vec!["word"; len].join(" ");
                Candidate {
                    turn: turn(i as u64, &format!("c{conv}"), role, "Sam", &text),
                    warmth,
                    mandatory,
                }
            })
            .collect()
    })
}

#[test]
fn a_long_turn_is_kept_before_shorter_ones_only_when_warmer_for_its_room() {
    let pick = |row, warmth, tokens| Pick {
        row: RowId(row),
        warmth,
        mandatory: false,
        tokens,
    };
    // Room for the long turn or for both short ones, not for all three.
    let cap = NOTE_ESTIMATE_TOKENS + 2 * (100 + LABEL_ESTIMATE_TOKENS);
    let long = 2 * (100 + LABEL_ESTIMATE_TOKENS) - LABEL_ESTIMATE_TOKENS;
    // The long turn takes the room of almost two: at 0.9 it is worth 0.48 for each 128 tokens.
    let cooler = [pick(1, 0.9, long), pick(2, 0.6, 100), pick(3, 0.5, 100)];
    assert_eq!(select(&cooler, cap), vec![1, 2]);
    let warmer = [pick(1, 0.9, long), pick(2, 0.4, 100), pick(3, 0.3, 100)];
    assert_eq!(select(&warmer, cap), vec![0]);
    // Turns within the room of one are ordered by warmth alone.
    let short = [pick(1, 0.2, 20), pick(2, 0.3, 100), pick(3, 0.25, 5)];
    assert_eq!(select(&short, usize::MAX), vec![1, 2, 0]);
}

/// [`select`]'s specification: the walk over every pick in full priority order.
fn select_by_full_sort(picks: &[Pick], cap: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..picks.len()).collect();
    order.sort_by(|&a, &b| priority(&picks[a], &picks[b]));
    let mut used = NOTE_ESTIMATE_TOKENS;
    order
        .into_iter()
        .filter(|&i| {
            let keep = picks[i].mandatory || used + picks[i].estimate() <= cap;
            if keep {
                used += picks[i].estimate();
            }
            keep
        })
        .collect()
}

/// Picks of distinct rows, many of them (past several chunks), warmth often tied; short
/// turns are rare, so the room left after a chunk is often still open to one further on.
/// Mandatory picks are few, or more than a chunk holds.
fn many_picks() -> impl Strategy<Value = Vec<Pick>> {
    prop_oneof![Just(0.02), Just(0.5)]
        .prop_flat_map(|mandatory_share| {
            proptest::collection::vec(
                (
                    prop_oneof![Just(0.5f32), Just(1.0), 0.0f32..4.0],
                    proptest::bool::weighted(mandatory_share),
                    prop_oneof![1 => 0usize..10, 99 => 10usize..2_000],
                ),
                0..3_000,
            )
        })
        .prop_map(|picks| {
            picks
                .into_iter()
                .enumerate()
                .map(|(row, (warmth, mandatory, tokens))| Pick {
                    row: RowId(row as u64 * 7 % 3_001),
                    warmth,
                    mandatory,
                    tokens,
                })
                .collect()
        })
}

#[test]
fn a_tool_message_shows_its_start_and_says_where_the_rest_is() {
    let long = "x".repeat(TOOL_PREVIEW_CHARS - 10);
    let mut first = turn(20, "s1", Role::Tool, "", &long);
    (first.message, first.chunks) = (RowId(20), 3);
    let mut second = turn(21, "s1", Role::Tool, "", "0123456789abcdefghij");
    (second.message, second.chunk, second.chunks) = (RowId(20), 1, 3);
    let mut third = turn(22, "s1", Role::Tool, "", "never shown");
    (third.message, third.chunk, third.chunks) = (RowId(20), 2, 3);
    let short = turn(23, "s1", Role::Tool, "", "called Bash {\"command\":\"ls\"}");
    let layout = Layout {
        tools: true,
        ..Layout::default()
    };
    let out = render(
        &[&first, &second, &third, &short],
        &layout,
        Omitted::default(),
    );
    let text = &out[0].content;
    assert!(
        text.contains(&format!(
            "{long}0123456789 … [cut here; memory_chain #20 returns the whole]"
        )),
        "{text}"
    );
    assert!(!text.contains("abcdefghij") && !text.contains("never shown"));
    assert!(
        text.ends_with("called Bash {\"command\":\"ls\"}"),
        "a short call is whole"
    );
    assert_eq!(out[0].rows, [RowId(20), RowId(21), RowId(22), RowId(23)]);
    assert_eq!(out[0].partial, [RowId(21), RowId(22)], "quoted in part");
    let quiet = render(&[&first, &second], &Layout::default(), Omitted::default());
    assert!(
        quiet[0]
            .content
            .ends_with("… [cut here; the whole is stored]")
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn select_keeps_what_the_walk_over_the_full_order_keeps(
        picks in many_picks(),
        cap in prop_oneof![0usize..500, 0usize..200_000, 0usize..5_000_000],
    ) {
        prop_assert_eq!(select(&picks, cap), select_by_full_sort(&picks, cap));
    }
}

proptest! {
    #[test]
    fn the_cap_holds_unless_the_mandatory_set_alone_exceeds_it(
        cs in candidates(),
        cap in 0usize..3_000,
        tools in any::<bool>(),
    ) {
        let layout = Layout { tools, current: Some("c1"), ..Layout::default() };
        let frame = fit(cs.clone(), cap, &layout, words, Omitted::default());
        let mandatory: Vec<RowId> = cs.iter().filter(|c| c.mandatory).map(|c| c.turn.row).collect();
        for row in &mandatory {
            prop_assert!(frame.rows.contains(row), "mandatory {row:?} dropped");
        }
        if frame.tokens > cap {
            let mut shown = frame.rows.clone();
            shown.sort();
            let mut expected = mandatory.clone();
            expected.sort();
            prop_assert_eq!(shown, expected);
        }
        prop_assert_eq!(frame.tokens, frame.messages.iter().map(|m| words(&m.content)).sum::<usize>());
        prop_assert_eq!(frame.omitted.turns, cs.len() - frame.rows.len());
        prop_assert_eq!(frame.messages.first().map(|m| m.role), Some(Side::User));
        for pair in frame.messages.windows(2) {
            prop_assert_ne!(pair[0].role, pair[1].role);
        }
    }

    #[test]
    fn warmer_optional_turns_for_their_room_are_kept_before_cooler_ones(cs in candidates(), cap in 0usize..3_000) {
        let frame = fit(cs.clone(), cap, &Layout::default(), words, Omitted::default());
        let shown = |c: &&Candidate| !c.mandatory && frame.rows.contains(&c.turn.row);
        let left_out = |c: &&Candidate| !c.mandatory && !frame.rows.contains(&c.turn.row);
        // An optional turn worth more for its room is left out while one worth less is
        // shown only when it was the larger of the two: it did not fit where the other did.
        for out in cs.iter().filter(left_out) {
            let worth = out.pick().value();
            for kept in cs.iter().filter(shown).filter(|k| k.pick().value() < worth) {
                prop_assert!(out.turn.tokens > kept.turn.tokens, "{out:?} left out, {kept:?} kept");
            }
        }
    }

    #[test]
    fn every_turn_appears_once_and_the_probe_question_once_at_the_end(cs in candidates()) {
        let layout = Layout { probe_question: Some("the live question?"), ..Layout::default() };
        let frame = fit(cs.clone(), usize::MAX / 2, &layout, words, Omitted::default());
        let mut rows = frame.rows.clone();
        rows.sort();
        rows.dedup();
        prop_assert_eq!(rows.len(), cs.len());
        let text: String = frame.messages.iter().map(|m| m.content.as_str()).collect::<Vec<_>>().join("\n");
        prop_assert_eq!(text.matches("the live question?").count(), 1);
        prop_assert!(text.ends_with("the live question?"));
    }
}
