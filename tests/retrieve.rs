//! Retrieval over the arena: catch-up reads only what is new, scopes never leak, results do not
//! depend on the thread count, and the two-stage search agrees with brute force.

mod common;

use std::collections::HashMap;

use perpetuity::arena::{Arena, NEIGHBOUR_WALK_ROWS, Side};
use perpetuity::capture::{Capturer, Message};
use perpetuity::datasets::{self, Format};
use perpetuity::ingest::ingest;
use perpetuity::integrity;
use perpetuity::retrieve::{
    CONTEXT_TERM_WEIGHT, CONTEXT_TERMS, PreparedQuery, brute_force, search,
};
use perpetuity::scan::kernels::{Ceiling, Kernels};
use perpetuity::store::{Store, StoreOptions};
use perpetuity::types::{Role, RowId, UserId};

fn open(dir: &std::path::Path) -> Store {
    let store = Store::open(dir, &StoreOptions::default()).unwrap();
    store
        .bind_dictionary(common::dictionary().version())
        .unwrap();
    store
}

/// Capture `messages` into `store` and catch a fresh arena up: the rows' ids and the arena.
fn captured(store: &Store, messages: &[Message]) -> (Vec<RowId>, Arena) {
    let dict = common::dictionary();
    let ids = Capturer::new(dict)
        .capture(store, messages)
        .unwrap()
        .into_iter()
        .flatten()
        .collect();
    let mut arena = Arena::new();
    arena.catch_up(store, dict).unwrap();
    (ids, arena)
}

fn say(user: &str, text: &str) -> Message {
    Message {
        user_key: user.into(),
        conversation: "c".into(),
        role: Role::User,
        name: None,
        timestamp_ms: None,
        source_turn: None,
        text: text.into(),
    }
}

/// A row's conversation neighbours are the nearest rows of the same user and conversation on
/// each side (row id order), across page boundaries, within the walk bound; never a row of
/// another user, even one with the same conversation key.
#[test]
fn neighbours_stay_in_their_user_and_conversation() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    // ann: conversation "a" throughout; "b" interleaved every third message, then a run of
    // "b" longer than the walk bound, then runs of "b" that put the next "a" at the bound and
    // one row past it, "a" between them. ben: conversation "a" too, interleaved.
    let mut ann: Vec<&str> = (0..100)
        .map(|i| if i % 3 == 0 { "b" } else { "a" })
        .collect();
    for run in [
        NEIGHBOUR_WALK_ROWS + 10,
        NEIGHBOUR_WALK_ROWS - 1,
        NEIGHBOUR_WALK_ROWS,
    ] {
        ann.extend(std::iter::repeat_n("b", run));
        ann.extend(["a"; 5]);
    }
    let mut messages = Vec::new();
    let mut conversation_of = Vec::new();
    for (i, &conversation) in ann.iter().enumerate() {
        messages.push(Message {
            conversation: conversation.into(),
            ..say("ann", &format!("ann message {i}"))
        });
        conversation_of.push(("ann", conversation));
        messages.push(Message {
            conversation: "a".into(),
            ..say("ben", &format!("ben message {i}"))
        });
        conversation_of.push(("ben", "a"));
    }
    let (ids, arena) = captured(&store, &messages);
    let facts: HashMap<RowId, (&str, &str)> = ids
        .iter()
        .copied()
        .zip(conversation_of.iter().copied())
        .collect();
    let row_of = |slot| {
        ids.iter()
            .copied()
            .find(|&id| arena.slot(id) == Some(slot))
            .unwrap()
    };
    let mut walked = 0;
    for (n, &id) in ids.iter().enumerate() {
        let (user, conversation) = facts[&id];
        let same_rows: Vec<usize> = (0..ids.len())
            .filter(|&m| facts[&ids[m]].0 == user)
            .collect();
        let at = same_rows.iter().position(|&m| m == n).unwrap();
        let expect = |side: Side| {
            let mut order: Vec<usize> = match side {
                Side::Before => same_rows[..at].iter().rev().copied().collect(),
                Side::After => same_rows[at + 1..].to_vec(),
            };
            order.truncate(NEIGHBOUR_WALK_ROWS);
            order
                .into_iter()
                .find(|&m| facts[&ids[m]].1 == conversation)
                .map(|m| ids[m])
        };
        for side in [Side::Before, Side::After] {
            let found = arena.neighbour(arena.slot(id).unwrap(), side).map(row_of);
            assert_eq!(
                found,
                expect(side),
                "row {id:?} ({user}, {conversation}) {side:?}"
            );
            walked += usize::from(found.is_some());
        }
    }
    assert!(walked > 700, "most rows have neighbours on both sides");
}

/// The answer to a remembered question comes right after the question, with none of its words:
/// the question's turn lifts it above turns that share a word with the query.
#[test]
fn a_turn_is_read_in_its_conversation() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let dict = common::dictionary();
    let turns = [
        "Which singer do you like best?",
        "Nina Simone, no question.",
        "The weather was grey all week.",
        "Best pancakes are made with buttermilk.",
        "My neighbour plays the trumpet badly.",
    ];
    let messages: Vec<Message> = turns.iter().map(|t| say("ann", t)).collect();
    let (ids, arena) = captured(&store, &messages);
    let query = PreparedQuery::new(dict, &arena, "Which singer does she like best?");
    let kernels = Kernels::detect(Ceiling::Native);
    let hits = search(
        dict,
        &arena,
        &kernels,
        &[UserId::from_key("ann")],
        &query,
        5,
    );
    let rank_of = |id: RowId| hits.iter().position(|h| h.row == id).unwrap();
    assert_eq!(rank_of(ids[0]), 0, "{hits:?}");
    assert_eq!(
        rank_of(ids[1]),
        1,
        "the answer follows its question: {hits:?}"
    );
}

#[test]
fn catch_up_reads_only_new_rows_and_scopes_never_leak() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let dict = common::dictionary();
    let capturer = Capturer::new(dict);
    let texts = [
        "My sister lives in Lisbon.",
        "I adopted a dog called Biscuit.",
        "Tax forms are due.",
    ];
    for user in ["ann", "ben"] {
        let messages: Vec<Message> = texts.iter().map(|t| say(user, t)).collect();
        capturer.capture(&store, &messages).unwrap();
    }
    let mut arena = Arena::new();
    assert_eq!(arena.catch_up(&store, dict).unwrap(), 6);
    assert_eq!(arena.catch_up(&store, dict).unwrap(), 0, "nothing new");
    assert_eq!(arena.watermark(), store.next_row());
    capturer
        .capture(&store, &[say("ann", "Biscuit chewed my shoes.")])
        .unwrap();
    assert_eq!(arena.catch_up(&store, dict).unwrap(), 1, "only the new row");
    assert_eq!(arena.rows(), 7);
    assert_eq!(
        arena.stats(),
        &store.frequency_table().unwrap(),
        "resident statistic = stored"
    );

    let mut report = integrity::Report::default();
    integrity::check_arena(&store, &arena, &mut report).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
    // A row the arena has not caught up with is reported, then disappears after catch-up.
    capturer
        .capture(
            &store,
            &[say("ben", "A row written behind the arena's back.")],
        )
        .unwrap();
    let mut behind = integrity::Report::default();
    integrity::check_arena(&store, &arena, &mut behind).unwrap();
    let found: Vec<&str> = behind.violations.iter().map(|v| v.check).collect();
    assert!(found.contains(&"stored row is in the arena"), "{found:?}");
    assert!(
        found.contains(&"resident statistic equals the stored counts"),
        "{found:?}"
    );
    arena.catch_up(&store, dict).unwrap();
    let mut caught = integrity::Report::default();
    integrity::check_arena(&store, &arena, &mut caught).unwrap();
    assert!(caught.is_clean(), "{:#?}", caught.violations);

    let kernels = Kernels::detect(Ceiling::Native);
    let (ann, ben) = (UserId::from_key("ann"), UserId::from_key("ben"));
    let query = PreparedQuery::new(dict, &arena, "What is my dog called?");
    let hits = search(dict, &arena, &kernels, &[ann], &query, 10);
    assert_eq!(hits.len(), 4);
    assert!(
        hits.iter().all(|h| h.user == ann),
        "ann's scope holds only ann's rows"
    );
    let top = store.row(ann, hits[0].row).unwrap().unwrap();
    assert!(top.text.contains("Biscuit"), "{}", top.text);
    let group = search(dict, &arena, &kernels, &[ann, ben], &query, 10);
    assert_eq!(group.len(), 8);
    assert!(group.iter().any(|h| h.user == ben));
    assert!(
        search(
            dict,
            &arena,
            &kernels,
            &[UserId::from_key("nobody")],
            &query,
            10
        )
        .is_empty()
    );
}

#[test]
fn locomo_two_stage_agrees_with_brute_force_and_with_itself() {
    let Some(file) = common::locomo_file("locomo_two_stage_agrees_with_brute_force") else {
        return;
    };
    let data = datasets::load(Format::Locomo, &file).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let dict = common::dictionary();
    ingest(&store, dict, &data.messages, |_, _| {}).unwrap();
    let mut arena = Arena::new();
    arena.catch_up(&store, dict).unwrap();
    let kernels = Kernels::detect(Ceiling::Native);

    // Turn index by (user, dia_id) for recall.
    let mut turn_row: HashMap<(UserId, String), RowId> = HashMap::new();
    for row in store.rows_since(RowId(0)) {
        let row = row.unwrap();
        turn_row.insert((row.user, row.source_turn.clone().unwrap()), row.id);
    }
    let everyone: Vec<UserId> = data
        .questions
        .iter()
        .map(|q| UserId::from_key(&q.user_key))
        .collect();

    let questions: Vec<_> = data
        .questions
        .iter()
        .filter(|q| {
            matches!(q.category.as_str(), "1" | "2" | "3" | "4") && !q.evidence_turns.is_empty()
        })
        .collect();
    // Every other question keeps the brute-force reference affordable in CI (it scores all
    // 5,882 rows exactly for each); both halves of the conversations are represented.
    let questions: Vec<_> = questions.into_iter().step_by(2).collect();
    let (mut agree, mut recall) = (0usize, 0.0f64);
    for q in &questions {
        let user = UserId::from_key(&q.user_key);
        let query = PreparedQuery::new(dict, &arena, &q.question);
        // The pooled group scope (every user, 5,882 rows) makes the first pass narrow for real.
        let two_stage = search(dict, &arena, &kernels, &everyone, &query, 10);
        let exact = brute_force(dict, &arena, &everyone, &query, 10);
        let set = |hits: &[perpetuity::retrieve::Retrieved]| {
            let mut rows: Vec<RowId> = hits.iter().map(|h| h.row).collect();
            rows.sort();
            rows
        };
        agree += usize::from(set(&two_stage) == set(&exact));
        // Recall as the user, over the user's own scope.
        let own = search(dict, &arena, &kernels, &[user], &query, 10);
        let found = q
            .evidence_turns
            .iter()
            .filter(|t| {
                own.iter()
                    .any(|h| Some(&h.row) == turn_row.get(&(user, (*t).clone())))
            })
            .count();
        recall += found as f64 / q.evidence_turns.len() as f64;
    }
    let fidelity = agree as f64 / questions.len() as f64;
    println!(
        "LoCoMo: {} questions; two-stage vs brute-force top-10 agreement over the 5,882-row pooled scope {:.4}; recall@10 in each user's own scope {:.3}",
        questions.len(),
        fidelity,
        recall / questions.len() as f64
    );
    assert!(fidelity >= 0.995, "fidelity {fidelity:.4}");

    // The same search on 1, 2, 4 and 16 threads gives the same list, scores included.
    let query = PreparedQuery::new(dict, &arena, &questions[0].question);
    let runs: Vec<_> = [1, 2, 4, 16]
        .iter()
        .map(|&threads| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| search(dict, &arena, &kernels, &everyone, &query, 50))
        })
        .collect();
    for run in &runs[1..] {
        assert_eq!(&runs[0], run);
    }
}

/// `perpetuity bench fidelity` at small scale: seeded synthetic queries over a 20,000-row
/// synthetic pool in one scope, the two-stage top 10 against brute force.
#[test]
fn synthetic_two_stage_agrees_with_brute_force() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let dict = common::dictionary();
    let messages =
        perpetuity::measure::synthetic_messages(20_000, 1, perpetuity::measure::MESSAGE_SEED);
    ingest(&store, dict, &messages, |_, _| {}).unwrap();
    let mut arena = Arena::new();
    arena.catch_up(&store, dict).unwrap();
    let asked: Vec<(Vec<UserId>, String)> = perpetuity::measure::synthetic_queries(100, 1)
        .into_iter()
        .map(|(user, text)| (vec![user], text))
        .collect();
    let kernels = Kernels::detect(Ceiling::Native);
    let fidelity = perpetuity::measure::fidelity(dict, &arena, &kernels, &asked);
    println!("synthetic 20,000 rows: {fidelity:?}");
    assert_eq!(fidelity.queries, 100);
    assert!(fidelity.share >= 0.995, "{fidelity:?}");

    // Stage one keeps 2,263 of the 20,000 rows here, split over tasks in both stages: the
    // lists, scores included, are the same on 1, 2 and 16 threads.
    for (scope, text) in asked.iter().take(10) {
        let query = PreparedQuery::new(dict, &arena, text);
        let runs: Vec<_> = [1, 2, 16]
            .iter()
            .map(|&threads| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap()
                    .install(|| search(dict, &arena, &kernels, scope, &query, 10))
            })
            .collect();
        assert_eq!(runs[0], runs[1], "{text}");
        assert_eq!(runs[0], runs[2], "{text}");
    }
}

/// A conversation's opening reads the two turns after it (`relevance::OPENING_AFTER`): an
/// opening with none of the query's words ranks by the turns that answer it, above notes that
/// share a word with the query, and the two-stage search returns it where brute force does,
/// though it is not among the candidates and the strongest match lies two rows after it.
#[test]
fn an_opening_ranks_by_the_turns_after_it_in_both_searches() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let dict = common::dictionary();
    let mut messages = Vec::new();
    for c in 0..8 {
        for text in [
            "Good morning, something new came up today.".to_string(),
            "Happy to help. Is it the copper one?".to_string(),
            format!("Plan {c}: a cedar birdhouse with a copper roof for the orchard wrens."),
        ] {
            messages.push(Message {
                conversation: format!("plan {c}"),
                ..say("ann", &text)
            });
        }
    }
    for f in 0..200 {
        messages.push(Message {
            conversation: format!("note {f}"),
            ..say("ann", &format!("Note {f}: the shed roof needs a look."))
        });
    }
    let (ids, arena) = captured(&store, &messages);
    let openings: Vec<RowId> = (0..8).map(|c| ids[3 * c]).collect();
    let query = PreparedQuery::new(dict, &arena, "cedar birdhouse copper roof wrens");
    let kernels = Kernels::detect(Ceiling::Native);
    let scope = [UserId::from_key("ann")];
    let mut openings_ranked = 0;
    for k in [10, 12, 16, 20] {
        let exact = brute_force(dict, &arena, &scope, &query, k);
        assert_eq!(
            search(dict, &arena, &kernels, &scope, &query, k),
            exact,
            "k = {k}"
        );
        openings_ranked += exact.iter().filter(|h| openings.contains(&h.row)).count();
    }
    assert!(openings_ranked > 0, "some opening ranks among the best");
}

/// A question read in its conversation keeps its own terms at full weight and adds each term
/// only the context holds at `CONTEXT_TERM_WEIGHT`; with no context it is the question alone.
#[test]
fn a_question_in_its_conversation_weighs_the_context_below_itself() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let dict = common::dictionary();
    let (ids, arena) = captured(
        &store,
        &[
            say("ann", "The ferry to Orkney leaves Scrabster at noon."),
            say("ann", "Pack the ferry tickets and a raincoat."),
        ],
    );
    let context: Vec<_> = ids.iter().map(|&id| arena.slot(id).unwrap()).collect();
    let question = "When does the ferry leave?";
    let alone = PreparedQuery::new(dict, &arena, question);
    let none = PreparedQuery::in_conversation(dict, &arena, question, &[]);
    assert_eq!(none.scorer.terms(), alone.scorer.terms());
    assert_eq!(none.scorer.idf(), alone.scorer.idf());
    assert_eq!(none.int8, alone.int8);

    let read = PreparedQuery::in_conversation(dict, &arena, question, &context);
    assert_eq!(read.retrieval.terms, alone.retrieval.terms);
    let idf_of = |query: &PreparedQuery| -> HashMap<_, f32> {
        query
            .scorer
            .terms()
            .iter()
            .map(|&(term, _)| term)
            .zip(query.scorer.idf().iter().copied())
            .collect()
    };
    let (own, in_context) = (idf_of(&alone), idf_of(&read));
    for (term, idf) in &own {
        assert_eq!(in_context[term], *idf, "a question's own term lost weight");
    }
    let added: Vec<_> = in_context.keys().filter(|t| !own.contains_key(t)).collect();
    assert!(
        (4..=CONTEXT_TERMS).contains(&added.len()),
        "the context added {} terms",
        added.len()
    );
    for term in added {
        let full = perpetuity::relevance::Bm25::idf(arena.stats(), *term);
        let weighted = in_context[term];
        assert!(
            (weighted - CONTEXT_TERM_WEIGHT * full).abs() <= 1e-6 * full.max(1.0),
            "{weighted} against {full}"
        );
    }
    assert_ne!(
        read.int8, alone.int8,
        "the context left the vector as it was"
    );

    // A long context adds only its rarest terms.
    let words: Vec<String> = (0..40).map(|i| format!("word{i}")).collect();
    let (more, arena) = captured(
        &store,
        &[
            say("ann", &words.join(" ")),
            say("ann", &words[..20].join(" ")),
        ],
    );
    let context: Vec<_> = more.iter().map(|&id| arena.slot(id).unwrap()).collect();
    let own = idf_of(&PreparedQuery::new(dict, &arena, question));
    let mut added: Vec<f32> = idf_of(&PreparedQuery::in_conversation(
        dict, &arena, question, &context,
    ))
    .into_iter()
    .filter(|(term, _)| !own.contains_key(term))
    .map(|(_, idf)| idf / CONTEXT_TERM_WEIGHT)
    .collect();
    let mut rarest: Vec<f32> = context
        .iter()
        .flat_map(|&slot| arena.row_entries(slot).terms.iter().map(|entry| entry.key))
        .map(perpetuity::types::TermId)
        .filter(|term| !own.contains_key(term))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .map(|term| perpetuity::relevance::Bm25::idf(arena.stats(), term))
        .collect();
    assert!(rarest.len() > CONTEXT_TERMS, "{} terms", rarest.len());
    rarest.sort_by(|a, b| b.total_cmp(a));
    rarest.truncate(CONTEXT_TERMS);
    added.sort_by(|a, b| b.total_cmp(a));
    assert_eq!(added.len(), CONTEXT_TERMS);
    for (added, rare) in added.iter().zip(&rarest) {
        assert!(
            (added - rare).abs() <= 1e-5 * rare.max(1.0),
            "{added} against {rare}"
        );
    }
}
