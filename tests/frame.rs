//! Recall end to end over a real store: retrieval reheats what it selects (and probing writes
//! nothing), the frame quotes stored turns verbatim grouped by conversation with the current one
//! last, names are resolved through the binding log when rendering, the mandatory set survives
//! any budget, and no other user's turn ever appears.

mod common;

use std::collections::HashMap;
use std::sync::LazyLock;

use perpetuity::arena::Arena;
use perpetuity::budget::Budget;
use perpetuity::capture::{Capturer, Message};
use perpetuity::frame::Side;
use perpetuity::heat;
use perpetuity::memory::Memory;
use perpetuity::recall::{Ask, Recall, RecallConfig, question_query, recall};
use perpetuity::scan::kernels::{Ceiling, Kernels};
use perpetuity::store::Activation;
use perpetuity::types::{Role, RowId, UserId};

const HOUR: i64 = 3_600_000;
/// 2024-03-01 09:00 UTC.
const MARCH_1: i64 = 1_709_283_600_000;

fn turn(user: &str, conversation: &str, role: Role, name: &str, hour: i64, text: &str) -> Message {
    Message {
        user_key: user.into(),
        conversation: conversation.into(),
        role,
        name: Some(name.into()),
        timestamp_ms: Some(MARCH_1 + hour * HOUR),
        source_turn: None,
        text: text.into(),
    }
}

/// Alice's memory: an earlier conversation holding a fact, a current one with small talk; Bob's
/// memory holds a canary about the same topic.
fn seeded(memory: &Memory) {
    let fillers = [
        "Good morning! How was the weekend?",
        "Pretty quiet, mostly reading on the balcony.",
        "Nice. The weather has been lovely lately.",
        "It has, I even had breakfast outside today.",
    ];
    let mut messages = vec![
        turn(
            "alice",
            "trip",
            Role::User,
            "Alice",
            0,
            "We booked the ferry to Orkney for the twelfth of June.",
        ),
        turn(
            "alice",
            "trip",
            Role::Assistant,
            "Guide",
            0,
            "Great, the ferry leaves Scrabster at noon.",
        ),
        turn(
            "bob",
            "trip",
            Role::User,
            "Bob",
            0,
            "CANARY-BOB my ferry to Orkney is on the ninth of July.",
        ),
    ];
    for (i, text) in fillers.iter().enumerate() {
        let role = if i % 2 == 0 {
            Role::User
        } else {
            Role::Assistant
        };
        let name = if i % 2 == 0 { "Alice" } else { "Guide" };
        messages.push(turn("alice", "chat", role, name, 48 + i as i64, text));
    }
    Capturer::new(&memory.dictionary)
        .capture(&memory.store, &messages)
        .unwrap();
}

fn arena(memory: &Memory) -> Arena {
    let mut arena = Arena::new();
    arena.catch_up(&memory.store, &memory.dictionary).unwrap();
    arena
}

fn activations(memory: &Memory, user: UserId) -> HashMap<RowId, Activation> {
    memory
        .store
        .activations_of(user)
        .collect::<Result<_, _>>()
        .unwrap()
}

/// The asking user, alone in her scope.
static ALICE: LazyLock<[UserId; 1]> = LazyLock::new(|| [UserId::from_key("alice")]);

fn ask<'a>(conversation: &'a str, question: &'a str, probe: bool) -> Ask<'a> {
    Ask {
        user: ALICE[0],
        scope: &*ALICE,
        conversation: Some(conversation),
        question,
        probe,
        hidden: &[],
        now_ms: Some(MARCH_1 + 60 * HOUR),
        pin: None,
        sent_tokens: None,
    }
}

fn run(memory: &Memory, config: &RecallConfig, ask: &Ask<'_>) -> Recall {
    let kernels = Kernels::detect(Ceiling::Native);
    recall(memory, &arena(memory), &kernels, config, ask).unwrap()
}

fn text(recall: &Recall) -> String {
    recall
        .frame
        .messages
        .iter()
        .map(|m| m.content.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_captured_question_is_the_last_turn_once_and_retrieval_reheats_what_it_selected() {
    let dir = tempfile::tempdir().unwrap();
    let memory = common::memory(dir.path());
    seeded(&memory);
    let question = "When is our ferry to Orkney?";
    let ids = Capturer::new(&memory.dictionary)
        .capture(
            &memory.store,
            &[turn("alice", "chat", Role::User, "Alice", 53, question)],
        )
        .unwrap();
    let alice = UserId::from_key("alice");
    let before = activations(&memory, alice);

    let recall = run(
        &memory,
        &RecallConfig::default(),
        &ask("chat", question, false),
    );
    let frame = &recall.frame;
    let all = text(&recall);
    assert_eq!(all.matches(question).count(), 1, "{all}");
    let last = frame.messages.last().unwrap();
    assert_eq!(last.role, Side::User);
    assert!(last.content.ends_with(question), "{}", last.content);
    assert_eq!(frame.rows.last(), Some(&ids[0][0]));
    assert!(
        !all.contains("CANARY-BOB"),
        "another user's turn leaked: {all}"
    );

    // The earlier conversation's fact is quoted verbatim, before the current conversation.
    let fact = all.find("We booked the ferry to Orkney for the twelfth of June.");
    let current = all.find("[This conversation from");
    assert!(
        fact.is_some() && current.is_some() && fact < current,
        "{all}"
    );
    assert!(all.contains("[Earlier conversation from 2024-03-01 09:00, 2 days before now]"));

    // The top hit was reheated, and only retrieval's reheat changed activation.
    let after = activations(&memory, alice);
    let top = RowId(recall.retrieved[0].row);
    assert!(after[&top].peak > heat::BORN_PEAK);
    assert_eq!(after[&top].decay.to_bits(), before[&top].decay.to_bits());
    let changed = after.iter().filter(|(id, a)| before[id] != **a).count();
    assert_eq!(changed, recall.reheated);
    assert!(recall.reheated > 0);

    // The warm index lists exactly the reheated rows, each with its activation.
    let warm: HashMap<RowId, Activation> = memory
        .store
        .warm_of(alice)
        .unwrap()
        .iter()
        .map(|(&row, &state)| (row, state))
        .collect();
    assert_eq!(warm.len(), recall.reheated);
    for (row, state) in &warm {
        assert_eq!(after[row], *state);
    }
    let report = perpetuity::integrity::check(&memory.store, &memory.dictionary).unwrap();
    assert!(report.is_clean(), "{:?}", report.violations);
}

#[test]
fn a_probe_appends_the_question_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let memory = common::memory(dir.path());
    seeded(&memory);
    let alice = UserId::from_key("alice");
    let (before, clock, next) = (
        activations(&memory, alice),
        memory.store.clock(alice).unwrap(),
        memory.store.next_row(),
    );
    let question = "Which port does the ferry leave from?";
    let recall = run(
        &memory,
        &RecallConfig::default(),
        &ask("chat", question, true),
    );
    let all = text(&recall);
    assert_eq!(all.matches(question).count(), 1);
    assert!(all.ends_with(question));
    assert!(all.contains("the ferry leaves Scrabster at noon"), "{all}");
    assert!(
        recall.reheated > 0,
        "the probe's frame still sees its reheat"
    );
    assert_eq!(activations(&memory, alice), before);
    assert_eq!(memory.store.clock(alice).unwrap(), clock);
    assert_eq!(memory.store.next_row(), next);
}

#[test]
fn the_mandatory_set_survives_a_budget_too_small_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let memory = common::memory(dir.path());
    seeded(&memory);
    let config = RecallConfig {
        budget: Budget {
            floor: 10,
            ceiling: 10,
        },
        mandatory_hits: 1,
        recent_tokens: 1,
        ..RecallConfig::default()
    };
    let recall = run(&memory, &config, &ask("chat", "ferry to Orkney", true));
    let frame = &recall.frame;
    assert!(frame.tokens > frame.cap);
    let top = RowId(recall.retrieved[0].row);
    let newest = memory
        .store
        .conversation_rows_newest_first(UserId::from_key("alice"), "chat")
        .next()
        .unwrap()
        .unwrap();
    let mut shown = frame.rows.clone();
    shown.sort();
    let mut mandatory = vec![top, newest];
    mandatory.sort();
    mandatory.dedup();
    assert_eq!(shown, mandatory, "exactly the mandatory set");
    assert_eq!(frame.mandatory, mandatory.len());
    assert!(text(&recall).contains("did not fit in this frame"));
}

#[test]
fn labels_use_the_name_bound_now_not_the_name_at_capture() {
    let dir = tempfile::tempdir().unwrap();
    let memory = common::memory(dir.path());
    // Two messages of one slot, the name changing between them: the later binding wins.
    Capturer::new(&memory.dictionary)
        .capture(
            &memory.store,
            &[
                turn(
                    "alice",
                    "chat",
                    Role::Assistant,
                    "Helper",
                    0,
                    "I can look up ferry times.",
                ),
                turn(
                    "alice",
                    "chat",
                    Role::Assistant,
                    "Ferrybot",
                    1,
                    "The ferry sails at noon.",
                ),
            ],
        )
        .unwrap();
    let recall = run(
        &memory,
        &RecallConfig::default(),
        &ask("chat", "ferry times", true),
    );
    let all = text(&recall);
    // The header shows 09:00, so the first label does not repeat it; the next one's hour
    // differs.
    assert!(
        all.contains("[Ferrybot] I can look up ferry times."),
        "{all}"
    );
    assert!(
        all.contains("[Ferrybot, 10:00] The ferry sails at noon."),
        "{all}"
    );
    assert!(!all.contains("Helper"), "{all}");
}

#[test]
fn rows_that_cooled_leave_the_warm_index_and_their_activation_stays() {
    let dir = tempfile::tempdir().unwrap();
    let memory = common::memory(dir.path());
    seeded(&memory);
    let alice = UserId::from_key("alice");
    let first = run(
        &memory,
        &RecallConfig::default(),
        &ask("chat", "ferry to Orkney", false),
    );
    assert!(first.reheated > 0);
    let reheated: Vec<RowId> = memory
        .store
        .warm_of(alice)
        .unwrap()
        .keys()
        .copied()
        .collect();
    assert_eq!(reheated.len(), first.reheated);

    // The agent processes far more than a reheat lasts: 250,000 tokens of clock.
    let long = "The weather report goes on and on. ".repeat(30_000);
    Capturer::new(&memory.dictionary)
        .capture(
            &memory.store,
            &[turn("alice", "chat", Role::User, "Alice", 60, &long)],
        )
        .unwrap();
    let clock = memory.store.clock(alice).unwrap();
    let config = RecallConfig::default();
    assert!(
        reheated
            .iter()
            .all(|row| heat::warmth(&activations(&memory, alice)[row], clock) < config.warm_floor),
        "the clock moved past every reheat"
    );
    run(
        &memory,
        &config,
        &ask("chat", "what about the weather report", false),
    );
    let warm: HashMap<RowId, Activation> = memory
        .store
        .warm_of(alice)
        .unwrap()
        .iter()
        .map(|(&row, &state)| (row, state))
        .collect();
    for (row, state) in &warm {
        assert!(
            heat::warmth(state, clock) >= config.warm_floor,
            "{row:?} is cold but listed"
        );
    }
    let after = activations(&memory, alice);
    for row in reheated.iter().filter(|r| !warm.contains_key(r)) {
        assert!(
            after[row].peak > heat::BORN_PEAK,
            "{row:?}: the activation keeps its reheat"
        );
    }
    assert!(
        reheated.iter().any(|r| !warm.contains_key(r)),
        "some cold row left the index"
    );
    let report = perpetuity::integrity::check(&memory.store, &memory.dictionary).unwrap();
    assert!(report.is_clean(), "{:?}", report.violations);
}

/// Alice's unrelated turns in a conversation of their own, one an hour from hour 1, spoken as
/// `role` by `name`: a memory's statistic then holds more than the turns a test is about.
fn chatter(role: Role, name: &str) -> impl Iterator<Item = Message> {
    [
        "The bakery on the corner sells rye bread.",
        "Rain is due on Thursday afternoon.",
        "The train was late again this morning.",
        "Painting the kitchen took all weekend.",
    ]
    .into_iter()
    .enumerate()
    .map(move |(hour, text)| turn("alice", "news", role, name, 1 + hour as i64, text))
}

/// The frame's order lifts the turns of a speaker the question names: two answers match the
/// question about as well, the one its speaker said comes first, and only by that lift.
#[test]
fn a_speaker_the_question_names_comes_first() {
    let dir = tempfile::tempdir().unwrap();
    let memory = common::memory(dir.path());
    let mut messages = vec![
        turn(
            "alice",
            "pets",
            Role::User,
            "Dana",
            0,
            "I walk the dog on the beach, the dog loves a long beach walk.",
        ),
        turn(
            "alice",
            "pets",
            Role::Assistant,
            "Eli",
            0,
            "I walk my dog in the park.",
        ),
    ];
    messages.extend(chatter(Role::Assistant, "Eli"));
    Capturer::new(&memory.dictionary)
        .capture(&memory.store, &messages)
        .unwrap();
    let first = |config: &RecallConfig, question: &str| {
        let recall = run(&memory, config, &ask("later", question, true));
        let top = recall.retrieved[0].row;
        memory
            .store
            .row(ALICE[0], RowId(top))
            .unwrap()
            .unwrap()
            .name
            .unwrap()
    };
    let unlifted = RecallConfig {
        speaker_lift: 0.0,
        ..RecallConfig::default()
    };
    let eli = "Where does Eli walk the dog?";
    assert_eq!(first(&unlifted, eli), "Dana");
    assert_eq!(first(&RecallConfig::default(), eli), "Eli");

    // A later message binds another name to the assistant of "pets": the lift follows the
    // name bound now (the store's copy of the binding log was read above, so this is its
    // update), not the one the row was captured with.
    Capturer::new(&memory.dictionary)
        .capture(
            &memory.store,
            &[turn(
                "alice",
                "pets",
                Role::Assistant,
                "Finn",
                9,
                "Back home now.",
            )],
        )
        .unwrap();
    let texts = |question: &str| -> Vec<String> {
        run(
            &memory,
            &RecallConfig::default(),
            &ask("later", question, true),
        )
        .retrieved
        .iter()
        .map(|r| {
            memory
                .store
                .row(ALICE[0], RowId(r.row))
                .unwrap()
                .unwrap()
                .text
        })
        .collect()
    };
    let park_first = |question: &str| {
        let texts = texts(question);
        let at = |word: &str| texts.iter().position(|t| t.contains(word)).unwrap();
        at("park") < at("beach")
    };
    assert!(park_first("Where does Finn walk the dog?"));
    assert!(!park_first(eli));
}

/// In the frame's order the model's own words yield to what the person said: the assistant's
/// answer repeats the user's fact and matches the question a little better, and comes second
/// only by `model_weight`: where the assistant has no name (a log of a person and an
/// assistant), and where the user has none (the proxy captures a question under no name and a
/// reply under the model's id); not where both sides are named (a chat between two people:
/// the weight leaves that order as it is).
#[test]
fn the_models_own_words_yield_to_what_the_person_said() {
    let order = |user: Option<&str>, assistant: Option<&str>, config: &RecallConfig| {
        let dir = tempfile::tempdir().unwrap();
        let memory = common::memory(dir.path());
        let said = |role, name: Option<&str>, text: &str| Message {
            name: name.map(str::to_owned),
            ..turn("alice", "family", role, "", 0, text)
        };
        let mut messages = vec![
            said(
                Role::User,
                user,
                "My sister's wedding is in Lisbon this May, and I still need a dress, a gift, a hotel, a car and a flight for two.",
            ),
            said(
                Role::Assistant,
                assistant,
                "Lovely, so your sister's wedding is in Lisbon in May.",
            ),
        ];
        messages.extend(chatter(Role::User, "Alice"));
        Capturer::new(&memory.dictionary)
            .capture(&memory.store, &messages)
            .unwrap();
        let recall = run(
            &memory,
            config,
            &ask("later", "When is my sister's wedding in Lisbon?", true),
        );
        recall
            .retrieved
            .iter()
            .map(|r| {
                let role = memory
                    .store
                    .row(ALICE[0], RowId(r.row))
                    .unwrap()
                    .unwrap()
                    .role;
                (role, r.score)
            })
            .collect::<Vec<_>>()
    };
    let unweighted = RecallConfig {
        model_weight: 1.0,
        ..RecallConfig::default()
    };
    for (user, assistant) in [(Some("Alice"), None), (None, Some("gpt-4o"))] {
        assert_eq!(order(user, assistant, &unweighted)[0].0, Role::Assistant);
        assert_eq!(
            order(user, assistant, &RecallConfig::default())[0].0,
            Role::User
        );
    }
    let people = order(Some("Alice"), Some("Guide"), &RecallConfig::default());
    assert_eq!(people[0].0, Role::Assistant);
    assert_eq!(people, order(Some("Alice"), Some("Guide"), &unweighted));
}

/// A conversation's first turn joins the frame after the conversation's best row: the
/// question matches a later turn only ("the aphids"), and the turn that says what the
/// conversation is about (the rose garden) is shown with it. Without openers, a reach of two
/// rows leaves it out; the conversation being continued gets no opener (the request holds it).
#[test]
fn a_retrieved_turn_brings_its_conversations_opening_turn() {
    let dir = tempfile::tempdir().unwrap();
    let memory = common::memory(dir.path());
    let garden = [
        "I am planning a rose garden along the south wall this spring.",
        "Climbing roses suit a south wall; give them a trellis.",
        "Something is eating the leaves, tiny green aphids everywhere.",
        "Spray the aphids with soapy water in the evening.",
    ];
    let mut messages = Vec::new();
    for (hour, text) in garden.iter().enumerate() {
        let (role, name) = if hour % 2 == 0 {
            (Role::User, "Alice")
        } else {
            (Role::Assistant, "Guide")
        };
        messages.push(turn("alice", "garden", role, name, hour as i64, text));
    }
    // Then far more than a birth's heat lasts: the garden's turns are cold unless retrieved.
    let long = "The weather report goes on and on. ".repeat(30_000);
    messages.push(turn("alice", "chat", Role::User, "Alice", 9, &long));
    Capturer::new(&memory.dictionary)
        .capture(&memory.store, &messages)
        .unwrap();
    let narrow = |openers| RecallConfig {
        reach: 2,
        depth: 2,
        openers,
        ..RecallConfig::default()
    };
    let question = "How do I get rid of the aphids?";
    let without = text(&run(&memory, &narrow(0), &ask("news", question, true)));
    assert!(without.contains("soapy water"), "{without}");
    assert!(!without.contains("rose garden"), "{without}");
    let with = run(&memory, &narrow(1), &ask("news", question, true));
    assert!(text(&with).contains("rose garden"), "{}", text(&with));
    assert_eq!(with.retrieved.len(), 3, "two rows and the opener");
    // Continuing the garden conversation itself: no opener is added.
    let current = run(&memory, &narrow(1), &ask("garden", question, true));
    assert_eq!(current.retrieved.len(), 2);
}

#[test]
fn a_question_is_read_in_its_conversation_and_the_search_passes_over_its_stretch() {
    let dir = tempfile::tempdir().unwrap();
    let memory = common::memory(dir.path());
    seeded(&memory);
    let capturer = Capturer::new(&memory.dictionary);
    let stretch = capturer
        .capture(
            &memory.store,
            &[
                turn(
                    "alice",
                    "plans",
                    Role::User,
                    "Alice",
                    50,
                    "Can you look at the Orkney ferry booking for me?",
                ),
                turn(
                    "alice",
                    "plans",
                    Role::Assistant,
                    "Guide",
                    50,
                    "Of course. Which part of the ferry booking?",
                ),
            ],
        )
        .unwrap();
    let stretch: Vec<RowId> = stretch.into_iter().flatten().collect();
    let booked = memory
        .store
        .rows_of(ALICE[0])
        .map(Result::unwrap)
        .find(|row| row.text.starts_with("We booked the ferry to Orkney"))
        .unwrap()
        .id;
    // Alone, the question holds none of the booking's words; in its conversation it does.
    let question = "Did you confirm it?";
    let config = RecallConfig::default();
    let probed = run(&memory, &config, &ask("plans", question, true));
    let retrieved: Vec<RowId> = probed.retrieved.iter().map(|r| RowId(r.row)).collect();
    assert_eq!(retrieved.first(), Some(&booked), "{retrieved:?}");
    for id in &stretch {
        assert!(!retrieved.contains(id), "the stretch was retrieved: {id:?}");
        assert!(probed.frame.rows.contains(id), "the stretch left the frame");
    }
    let alone = run(&memory, &config, &ask("chat", question, true));
    assert!(
        alone.retrieved.first().map(|r| RowId(r.row)) != Some(booked),
        "the question alone found the booking: the test shows nothing"
    );

    // Captured, the question is read the same way: its own row is not its context.
    capturer
        .capture(
            &memory.store,
            &[turn("alice", "plans", Role::User, "Alice", 50, question)],
        )
        .unwrap();
    let arena = arena(&memory);
    let live = ask("plans", question, false);
    let stretch =
        perpetuity::recall::stretch(&memory.store, &arena, &live, &config, &Default::default())
            .unwrap();
    let stretch = &stretch.rows[..stretch.recent];
    let read = |ask: &Ask<'_>, stretch| {
        let query = question_query(&memory.dictionary, &arena, ask, stretch);
        (
            query.scorer.terms().to_vec(),
            query.scorer.idf().to_vec(),
            query.int8.values,
        )
    };
    let probe = ask("plans", question, true);
    assert_eq!(read(&live, stretch), read(&probe, &stretch[1..]));
    // A client's retry (a probe, its question stored already) reads it the same way too.
    assert_eq!(read(&live, stretch), read(&probe, stretch));
    let recalled = run(&memory, &config, &live);
    assert_eq!(
        recalled.retrieved.first().map(|r| RowId(r.row)),
        Some(booked)
    );
}

/// A coding agent's session: turns of prompts, calls, file reads of a few thousand tokens each
/// and replies.
fn working_session(turns: usize) -> Vec<Message> {
    let mut messages = Vec::new();
    for t in 0..turns {
        let hour = 70 + t as i64;
        let say = |role, name, text: String| turn("alice", "session", role, name, hour, &text);
        messages.push(say(
            Role::User,
            "Alice",
            format!("Step {t}: make parser_{t} accept the input from ticket T-{t}0{t}."),
        ));
        for read in 0..3 {
            messages.push(say(
                Role::Tool,
                "tool",
                format!("called Read {{\"file_path\":\"src/parser_{t}_{read}.rs\"}}"),
            ));
            let body: String = (0..200)
                .map(|line| format!("let value_{t}_{read}_{line} = decode_{line}(input);\n"))
                .collect();
            messages.push(say(Role::Tool, "tool", format!("Read returned: {body}")));
        }
        messages.push(say(
            Role::Assistant,
            "Guide",
            format!("Done: parser_{t} now calls finish_{t}()."),
        ));
    }
    messages
}

#[test]
fn a_working_session_keeps_its_course_whole_and_its_older_reads_in_preview() {
    let dir = tempfile::tempdir().unwrap();
    let memory = common::memory(dir.path());
    seeded(&memory);
    let capturer = Capturer::new(&memory.dictionary);
    capturer
        .capture(&memory.store, &working_session(12))
        .unwrap();
    let config = RecallConfig::default();
    let next = "Step 12: make parser_12 accept the input too.";
    capturer
        .capture(
            &memory.store,
            &[turn("alice", "session", Role::User, "Alice", 90, next)],
        )
        .unwrap();
    let recall = run(&memory, &config, &ask("session", next, false));
    let frame = text(&recall);
    // The read the agent has not moved past is quoted whole, older ones by their preview;
    // every prompt and reply within the stretch is there whole.
    assert!(frame.contains("let value_11_2_199 = decode_199(input);"));
    let previewed = (0..12).find(|t| {
        frame.contains(&format!("let value_{t}_0_0 = "))
            && !frame.contains(&format!("let value_{t}_0_199 = "))
    });
    let previewed = previewed.expect("no older read shown by its preview");
    for t in previewed..12 {
        assert!(
            frame.contains(&format!("Step {t}: make parser_{t} accept")),
            "turn {t}"
        );
        assert!(frame.contains(&format!("Done: parser_{t} now calls finish_{t}().")));
    }

    // A long live prompt, far over the chat's stretch, still arrives whole.
    let question: String = (0..600)
        .map(|i| format!("Line {i} of the pasted log: worker-{i} exited with status {i}.\n"))
        .collect();
    capturer
        .capture(
            &memory.store,
            &[turn("alice", "session", Role::User, "Alice", 91, &question)],
        )
        .unwrap();
    let recall = run(&memory, &config, &ask("session", &question, false));
    assert!(
        text(&recall).contains(question.trim_end()),
        "the live prompt was cut"
    );
    // The live turn, the chat's stretch and the budget, the session's warm tool messages and
    // the rest of its stretch on top (labels and headers aside): a fraction of the session.
    let tokenizer = perpetuity::tokens::Tokenizer::new();
    let bound = tokenizer.count(&question)
        + config.recent_tokens
        + config.budget.ceiling
        + 2 * config.session_tokens;
    assert!(
        recall.frame.tokens <= bound + 2_000,
        "{} tokens framed, over {bound}",
        recall.frame.tokens
    );
}

#[test]
fn a_working_sessions_next_turn_keeps_its_frame_as_the_start_of_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let memory = common::memory(dir.path());
    seeded(&memory);
    let capturer = Capturer::new(&memory.dictionary);
    let mut session = working_session(8);
    let first = "Now make the ferry parser accept the Orkney timetable.";
    session.push(turn("alice", "session", Role::User, "Alice", 90, first));
    capturer.capture(&memory.store, &session).unwrap();
    let config = RecallConfig::default();
    let before = run(&memory, &config, &ask("session", first, false));
    let pin = before
        .pin
        .clone()
        .expect("a working session keeps a part of its frame");

    // The turn goes on: a read, a reply, then the next prompt.
    let second = "Does the timetable parser handle the ferry's winter sailings?";
    let next = [
        turn(
            "alice",
            "session",
            Role::Tool,
            "tool",
            91,
            "called Read {\"file_path\":\"src/timetable.rs\"}",
        ),
        turn(
            "alice",
            "session",
            Role::Tool,
            "tool",
            91,
            "Read returned: fn winter_sailings() -> Vec<Sailing> { Vec::new() }",
        ),
        turn(
            "alice",
            "session",
            Role::Assistant,
            "Guide",
            91,
            "The timetable parser now reads the Orkney ferry.",
        ),
        turn("alice", "session", Role::User, "Alice", 92, second),
    ];
    capturer.capture(&memory.store, &next).unwrap();
    let kept = Ask {
        pin: Some(&pin),
        ..ask("session", second, false)
    };
    let after = run(&memory, &config, &kept);
    assert_eq!(after.pin.as_ref().map(|p| p.anchor), Some(pin.anchor));
    let (was, is) = (text(&before), text(&after));
    let question_at = was.find(first).unwrap();
    let stable = was[..question_at]
        .find("more remembered turn")
        .map_or(&was[..question_at], |at| &was[..at]);
    let stable = &stable[..stable.rfind("\n\n").unwrap_or(0)];
    assert!(
        stable.len() * 2 > was.len(),
        "the part a next turn can keep is short: {} of {} bytes",
        stable.len(),
        was.len()
    );
    assert!(
        is.starts_with(stable),
        "the next turn's frame does not start with the last one's"
    );
    assert!(is.contains(second) && is.contains("fn winter_sailings()"));
}
