//! The store with real RocksDB in temp dirs: capture round trip, integrity, seeded corruption,
//! purge, and a model-based proptest over random capture/purge sequences.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use perpetuity::capture::{Capturer, Message};
use perpetuity::dictionary::stats::Count;
use perpetuity::ingest::export;
use perpetuity::integrity;
use perpetuity::store::{Activation, Cf, FORMAT_VERSION, Store, StoreOptions, keys};
use perpetuity::types::{ConversationId, Role, RowId, TokenId, UserId};
use proptest::prelude::*;

fn open(dir: &Path, compression: bool) -> Store {
    let store = Store::open(
        dir,
        &StoreOptions {
            sync_writes: false,
            compression,
        },
    )
    .unwrap();
    store
        .bind_dictionary(common::dictionary().version())
        .unwrap();
    store
}

fn message(user: &str, conversation: &str, role: Role, name: Option<&str>, text: &str) -> Message {
    Message {
        user_key: user.into(),
        conversation: conversation.into(),
        role,
        name: name.map(str::to_owned),
        timestamp_ms: Some(1_700_000_000_000),
        source_turn: Some(format!("{conversation}:{}", text.len())),
        text: text.into(),
    }
}

/// Exported rows of one user as (role, name, text) lines (the user's own line, which follows
/// them, left out).
fn exported(store: &Store, user: &str) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    export(store, Some(user), &mut out).unwrap();
    String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|line| line.get("row").is_some())
        .collect()
}

fn assert_clean(store: &Store) {
    let report = integrity::check(store, common::dictionary()).unwrap();
    assert!(report.is_clean(), "violations: {:#?}", report.violations);
}

#[test]
fn capture_round_trips_verbatim() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), true);
    let capturer = Capturer::new(common::dictionary());
    let long = "This sentence is part of a long message. ".repeat(60);
    let messages = vec![
        message(
            "alice",
            "c1",
            Role::User,
            Some("Alice"),
            "Hi! I adopted a dog named Biscuit. 🐕",
        ),
        message(
            "alice",
            "c1",
            Role::Assistant,
            Some("Helper"),
            "Congratulations on Biscuit!",
        ),
        message("alice", "c1", Role::User, Some("Alice"), &long),
        message("bob", "c9", Role::User, None, "Bob's first message."),
        message("alice", "c2", Role::User, Some("Alice"), ""),
    ];
    let ids = capturer.capture(&store, &messages).unwrap();
    assert_eq!(ids[0], [RowId(1)]);
    assert_eq!(ids[1], [RowId(2)]);
    assert!(ids[2].len() > 1, "a long message is chunked");
    assert!(ids[4].is_empty(), "an empty message stores nothing");

    let alice = exported(&store, "alice");
    let texts: Vec<&str> = alice.iter().map(|r| r["text"].as_str().unwrap()).collect();
    assert_eq!(texts[0], messages[0].text);
    assert_eq!(texts[1], messages[1].text);
    assert_eq!(
        texts[2..].concat(),
        long,
        "chunks concatenate to the message verbatim"
    );
    assert_eq!(alice[0]["name"], "Alice");
    assert_eq!(alice[1]["role"], "assistant");
    assert!(alice.iter().all(|r| r["user"] == "alice"));
    assert_eq!(exported(&store, "bob").len(), 1);

    // The clock counts the user's captured tokens; every row is born hot at its message's clock.
    let tokens: u64 = alice
        .iter()
        .map(|r| {
            perpetuity::tokens::Tokenizer::new()
                .encode(r["text"].as_str().unwrap())
                .len() as u64
        })
        .sum();
    assert_eq!(store.clock(UserId::from_key("alice")).unwrap(), tokens);
    assert_clean(&store);

    // Reopening keeps everything and continues the row sequence.
    let next = store.next_row();
    drop(store);
    let store = open(dir.path(), true);
    assert_eq!(store.next_row(), next);
    let more = capturer
        .capture(
            &store,
            &[message("bob", "c9", Role::Assistant, None, "Reply.")],
        )
        .unwrap();
    assert_eq!(more[0], [next]);
    assert_clean(&store);
}

/// The first row of each conversation asked for, in the order asked, whatever the order of
/// the keys; `None` for a conversation without rows, including one whose key sorts between or
/// after another user's conversations, and for a user without rows.
#[test]
fn first_rows_of_finds_each_conversations_opening_row() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), false);
    let capturer = Capturer::new(common::dictionary());
    let said = |user: &str, conversation: &str, text: &str| {
        message(user, conversation, Role::User, None, text)
    };
    capturer
        .capture(
            &store,
            &[
                said("alice", "garden", "Planning a rose garden."),
                said("bob", "trip", "An RV trip around the South Island."),
                said("alice", "garden", "The aphids are back."),
                said("alice", "taxes", "The tax return is due in April."),
                said("bob", "trip", "Lunch at the lake on day two."),
            ],
        )
        .unwrap();
    let (alice, bob, carol) = (
        UserId::from_key("alice"),
        UserId::from_key("bob"),
        UserId::from_key("carol"),
    );
    let conversation = ConversationId::from_key;
    let first = |user, name: &str| {
        store
            .conversation_rows_from(user, name, RowId(0))
            .next()
            .unwrap()
            .unwrap()
    };
    let asked = [
        (bob, conversation("trip")),
        (alice, conversation("taxes")),
        (alice, conversation("nowhere")),
        (alice, conversation("garden")),
        (bob, conversation("garden")),
        (carol, conversation("trip")),
        (bob, conversation("trip")),
    ];
    assert_eq!(
        store.first_rows_of(&asked).unwrap(),
        [
            Some(first(bob, "trip")),
            Some(first(alice, "taxes")),
            None,
            Some(first(alice, "garden")),
            None,
            None,
            Some(first(bob, "trip")),
        ]
    );
    assert_eq!(first(alice, "garden"), RowId(1));
    assert_eq!(first(bob, "trip"), RowId(2));
    assert_eq!(store.first_rows_of(&[]).unwrap(), []);
}

#[test]
fn a_store_of_another_dictionary_or_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), true);
    assert!(store.bind_dictionary("v0-other").is_err());
    store
        .raw_put(Cf::Meta, keys::meta::FORMAT_VERSION, &7u32.to_le_bytes())
        .unwrap();
    drop(store);
    let err = Store::open(dir.path(), &StoreOptions::default()).unwrap_err();
    assert!(err.to_string().contains("format version 7"), "{err}");
}

/// A store marked format 1 (whose rows may be of the fixed-width encodings, which still
/// decode: `store::row` and `tests/dictionary.rs` test those) opens with its rows, and is
/// marked the current format from then on, so a build that reads only format 1 refuses it.
#[test]
fn a_store_of_the_first_format_opens_and_is_marked_the_current_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = seeded(dir.path());
    let alice = UserId::from_key("alice");
    let rows: Vec<_> = store.rows_of(alice).map(Result::unwrap).collect();
    assert!(!rows.is_empty());
    store
        .raw_put(Cf::Meta, keys::meta::FORMAT_VERSION, &1u32.to_le_bytes())
        .unwrap();
    drop(store);
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    let again: Vec<_> = store.rows_of(alice).map(Result::unwrap).collect();
    assert_eq!(again, rows);
    assert_eq!(
        store.get(Cf::Meta, keys::meta::FORMAT_VERSION).unwrap(),
        Some(FORMAT_VERSION.to_le_bytes().to_vec())
    );
    const { assert!(FORMAT_VERSION > 1) };
}

/// Capture a small two-user memory and return the store.
fn seeded(dir: &Path) -> Store {
    let store = open(dir, true);
    let capturer = Capturer::new(common::dictionary());
    capturer
        .capture(
            &store,
            &[
                message(
                    "alice",
                    "c1",
                    Role::User,
                    Some("Alice"),
                    "I love hiking in the Alps.",
                ),
                message(
                    "alice",
                    "c1",
                    Role::Assistant,
                    Some("Helper"),
                    "Which trail?",
                ),
                message(
                    "bob",
                    "c1",
                    Role::User,
                    Some("Bob"),
                    "My cat is called Miso.",
                ),
            ],
        )
        .unwrap();
    assert_clean(&store);
    store
}

/// A span of the capture log reads the same rows, each with its retrieval row, by lookups (a
/// few rows: a request's catch-up) as by one range scan of each family (a longer span: a cold
/// open).
#[test]
fn logged_rows_read_the_same_by_lookups_and_by_range_scans() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), true);
    let messages: Vec<Message> = (0..12)
        .map(|i| {
            let user = if i % 3 == 0 { "bob" } else { "alice" };
            let text = format!("Fact number {i}: the spare key is in drawer {i}.");
            message(user, "c1", Role::User, None, &text)
        })
        .collect();
    Capturer::new(common::dictionary())
        .capture(&store, &messages)
        .unwrap();
    let alice = UserId::from_key("alice");
    let ids: Vec<RowId> = store
        .log_since(RowId(0))
        .map(Result::unwrap)
        .filter(|&(_, user)| user == alice)
        .map(|(id, _)| id)
        .collect();
    assert_eq!(ids.len(), 8, "a span long enough to be read by range scans");
    let scanned = store.logged_rows(Cf::Retrieval, alice, &ids).unwrap();
    let looked_up: Vec<_> = ids
        .chunks(2)
        .flat_map(|span| store.logged_rows(Cf::Retrieval, alice, span).unwrap())
        .collect();
    assert_eq!(scanned, looked_up);
    let texts: Vec<&str> = scanned.iter().map(|(row, _)| row.text.as_str()).collect();
    assert_eq!(texts[0], "Fact number 1: the spare key is in drawer 1.");
    assert!(scanned.iter().all(|(_, retrieval)| retrieval.is_some()));
}

fn checks(store: &Store) -> Vec<&'static str> {
    integrity::check(store, common::dictionary())
        .unwrap()
        .violations
        .into_iter()
        .map(|v| v.check)
        .collect()
}

#[test]
fn reheating_patches_activation_and_keeps_the_birth_decay() {
    let dir = tempfile::tempdir().unwrap();
    let store = seeded(dir.path());
    let alice = UserId::from_key("alice");
    let key = keys::user_row(alice, RowId(1));
    let born = Activation::decode(&store.get(Cf::Activation, &key).unwrap().unwrap()).unwrap();
    let clock = store.clock(alice).unwrap();
    store
        .patch_activation(&[
            (alice, RowId(1), clock, 2.5),
            (alice, RowId(77), clock, 9.0),
        ])
        .unwrap();
    let now = Activation::decode(&store.get(Cf::Activation, &key).unwrap().unwrap()).unwrap();
    assert_eq!((now.last_clock, now.peak), (clock, 2.5));
    assert_eq!(
        now.decay.to_bits(),
        born.decay.to_bits(),
        "decay is never rewritten"
    );
    assert!(
        store
            .get(Cf::Activation, &keys::user_row(alice, RowId(77)))
            .unwrap()
            .is_none(),
        "no activation is created for a row that does not exist"
    );
    assert_clean(&store);
}

/// The warm index as the `warm` family records it (what a store opened afresh reads).
fn warm_on_disk(store: &Store, user: UserId) -> BTreeMap<RowId, Activation> {
    store
        .iter_all(Cf::Warm)
        .map(|entry| {
            let (key, value) = entry.unwrap();
            let (owner, row) = keys::parse_user_row(&key).unwrap();
            (owner, row, Activation::decode(&value).unwrap())
        })
        .filter(|&(owner, _, _)| owner == user)
        .map(|(_, row, state)| (row, state))
        .collect()
}

/// The rows `user`'s warm index lists, as the store serves it.
fn listed(store: &Store, user: UserId) -> Vec<RowId> {
    store.warm_of(user).unwrap().keys().copied().collect()
}

#[test]
fn the_warm_index_in_memory_follows_every_write_to_its_family() {
    let dir = tempfile::tempdir().unwrap();
    let store = seeded(dir.path());
    let (alice, bob) = (UserId::from_key("alice"), UserId::from_key("bob"));
    let clock = store.clock(alice).unwrap();
    store
        .patch_activation(&[(alice, RowId(1), clock, 2.0)])
        .unwrap();
    let first = store.warm_of(alice).unwrap();
    assert_eq!(listed(&store, alice), [RowId(1)]);
    assert!(store.warm_of(bob).unwrap().is_empty());

    // Writes after the first read: a reheat, a new row listed, another user's, a forgetting.
    store
        .patch_activation(&[
            (alice, RowId(1), clock, 2.5),
            (alice, RowId(2), clock, 1.5),
            (alice, RowId(77), clock, 9.0),
            (bob, RowId(3), clock, 3.0),
        ])
        .unwrap();
    assert_eq!(
        first[&RowId(1)].peak,
        2.0,
        "a snapshot already read stays as it was"
    );
    for user in [alice, bob] {
        assert_eq!(*store.warm_of(user).unwrap(), warm_on_disk(&store, user));
    }
    assert_eq!(store.warm_of(alice).unwrap()[&RowId(1)].peak, 2.5);
    assert!(!store.warm_of(alice).unwrap().contains_key(&RowId(77)));
    store.forget_cold(alice, &[RowId(1)]).unwrap();
    assert_eq!(listed(&store, alice), [RowId(2)]);
    assert_eq!(*store.warm_of(alice).unwrap(), warm_on_disk(&store, alice));

    // A purge empties the user's index in memory as on disk; a reopened store reads the same.
    store.purge_user(bob).unwrap();
    assert!(store.warm_of(bob).unwrap().is_empty());
    drop(store);
    let store = open(dir.path(), true);
    assert_eq!(listed(&store, alice), [RowId(2)]);
    assert!(store.warm_of(bob).unwrap().is_empty());
    assert_clean(&store);
}

/// Every speaker slot's latest bound name, read from the `bindings` family itself.
fn bound_on_disk(store: &Store, user: UserId) -> BTreeMap<(ConversationId, Role), String> {
    store
        .iter_user(Cf::Bindings, user)
        .map(|entry| {
            let (key, value) = entry.unwrap();
            let (_, conversation, role, _) = keys::parse_binding(&key).unwrap();
            (
                (conversation, role),
                String::from_utf8(value.to_vec()).unwrap(),
            )
        })
        .collect()
}

fn bound_in_memory(store: &Store, user: UserId) -> BTreeMap<(ConversationId, Role), String> {
    store
        .bound_names(user)
        .unwrap()
        .iter()
        .map(|(&slot, name)| (slot, name.to_string()))
        .collect()
}

/// Each user's bound names in memory equal the family's.
fn assert_bound_as_on_disk(store: &Store, users: &[UserId]) {
    for &user in users {
        assert_eq!(bound_in_memory(store, user), bound_on_disk(store, user));
    }
}

/// The name bound now to `role` in alice's conversation "trip".
fn bound_in_trip(store: &Store, role: Role) -> Option<String> {
    store
        .bound_name(
            UserId::from_key("alice"),
            ConversationId::from_key("trip"),
            role,
        )
        .unwrap()
        .map(|name| name.to_string())
}

#[test]
fn the_bound_names_in_memory_follow_every_write_to_the_binding_log() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), true);
    let capturer = Capturer::new(common::dictionary());
    let (alice, bob) = (UserId::from_key("alice"), UserId::from_key("bob"));
    let trip = ConversationId::from_key("trip");
    capturer
        .capture(
            &store,
            &[
                message(
                    "alice",
                    "trip",
                    Role::User,
                    Some("Ann"),
                    "Shall we go north?",
                ),
                message("alice", "trip", Role::Assistant, None, "North it is."),
                message("bob", "trip", Role::User, Some("Bo"), "Any plans?"),
            ],
        )
        .unwrap();
    let first = store.bound_names(alice).unwrap();
    assert_bound_as_on_disk(&store, &[alice]);
    assert_eq!(bound_in_trip(&store, Role::User).as_deref(), Some("Ann"));
    assert_eq!(bound_in_trip(&store, Role::Assistant), None);

    // Writes after the first read: a rename, a new slot, the same name again (no binding).
    capturer
        .capture(
            &store,
            &[
                message("alice", "trip", Role::User, Some("Annie"), "Or south?"),
                message(
                    "alice",
                    "trip",
                    Role::Assistant,
                    Some("Guide"),
                    "South, then.",
                ),
                message("alice", "trip", Role::User, Some("Annie"), "South."),
            ],
        )
        .unwrap();
    assert_eq!(
        first[&(trip, Role::User)].as_ref(),
        "Ann",
        "a snapshot already read stays as it was"
    );
    assert_bound_as_on_disk(&store, &[alice, bob]);
    assert_eq!(bound_in_trip(&store, Role::User).as_deref(), Some("Annie"));
    assert_eq!(
        bound_in_trip(&store, Role::Assistant).as_deref(),
        Some("Guide")
    );

    // A purge empties the user's names in memory as on disk; a new capture binds afresh.
    store.purge_user(alice).unwrap();
    assert!(store.bound_names(alice).unwrap().is_empty());
    capturer
        .capture(
            &store,
            &[message(
                "alice",
                "trip",
                Role::User,
                Some("Ada"),
                "Hello again.",
            )],
        )
        .unwrap();
    assert_bound_as_on_disk(&store, &[alice]);
    assert_eq!(bound_in_trip(&store, Role::User).as_deref(), Some("Ada"));
    drop(store);
    let store = open(dir.path(), true);
    assert_bound_as_on_disk(&store, &[alice, bob]);
    assert_clean(&store);
}

#[test]
fn integrity_finds_a_deleted_retrieval_row() {
    let dir = tempfile::tempdir().unwrap();
    let store = seeded(dir.path());
    let key = keys::user_row(UserId::from_key("alice"), RowId(1));
    store.raw_delete(Cf::Retrieval, &key).unwrap();
    let found = checks(&store);
    assert!(found.contains(&"row has a retrieval row"), "{found:?}");
    // The recount no longer sees that row's terms, so counts disagree too.
    assert!(found.contains(&"count equals recount"), "{found:?}");
}

#[test]
fn owner_links_find_a_credentials_sub_users_and_integrity_checks_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = seeded(dir.path());
    let (alice, bob, carol) = (
        UserId::from_key("alice"),
        UserId::from_key("bob"),
        UserId::from_key("carol"),
    );
    store.link_owner(alice, carol).unwrap();
    store.link_owner(alice, carol).unwrap();
    store.link_owner(bob, carol).unwrap();
    assert_eq!(store.sub_users(carol).unwrap(), {
        let mut both = vec![alice, bob];
        both.sort();
        both
    });
    assert!(store.sub_users(alice).unwrap().is_empty());
    assert_clean(&store);
    store
        .raw_put(Cf::Owners, &keys::user(bob), &keys::user(bob))
        .unwrap();
    store
        .raw_put(Cf::Owners, &keys::user(alice), b"not an id")
        .unwrap();
    let found = checks(&store);
    assert!(
        found.contains(&"owner link names another user"),
        "{found:?}"
    );
    assert!(found.contains(&"owner link decodes"), "{found:?}");
}

#[test]
fn integrity_finds_a_bumped_count() {
    let dir = tempfile::tempdir().unwrap();
    let store = seeded(dir.path());
    let key = keys::count::key(Count::Token(TokenId(4))); // a token no row has
    store
        .raw_put(Cf::Counts, &key, &1i64.to_le_bytes())
        .unwrap();
    let rows_key = keys::count::key(Count::Rows);
    store
        .raw_put(Cf::Counts, &rows_key, &4i64.to_le_bytes())
        .unwrap();
    let report = integrity::check(&store, common::dictionary()).unwrap();
    let keys: Vec<&str> = report.violations.iter().map(|v| v.key.as_str()).collect();
    assert_eq!(report.violations.len(), 2, "{:#?}", report.violations);
    assert!(keys.contains(&perpetuity::store::hex_key(&key).as_str()));
    assert!(keys.contains(&perpetuity::store::hex_key(&rows_key).as_str()));
}

#[test]
fn integrity_finds_an_orphan_activation_and_a_rewritten_decay() {
    let dir = tempfile::tempdir().unwrap();
    let store = seeded(dir.path());
    let alice = UserId::from_key("alice");
    let orphan = Activation {
        last_clock: 1,
        peak: 1.0,
        decay: 0.1,
    };
    store
        .raw_put(
            Cf::Activation,
            &keys::user_row(alice, RowId(99)),
            &orphan.encode(),
        )
        .unwrap();
    let rewritten = Activation {
        last_clock: 5,
        peak: 1.0,
        decay: 0.5,
    };
    store
        .raw_put(
            Cf::Activation,
            &keys::user_row(alice, RowId(1)),
            &rewritten.encode(),
        )
        .unwrap();
    let found = checks(&store);
    assert!(found.contains(&"no orphan"), "{found:?}");
    assert!(found.contains(&"decay never rewritten"), "{found:?}");
}

#[test]
fn integrity_finds_a_wrong_clock_and_an_unlogged_row() {
    let dir = tempfile::tempdir().unwrap();
    let store = seeded(dir.path());
    let bob = UserId::from_key("bob");
    store
        .raw_put(Cf::Clock, &keys::user(bob), &1u64.to_le_bytes())
        .unwrap();
    store.raw_delete(Cf::Log, &keys::log(RowId(3))).unwrap();
    let found = checks(&store);
    assert!(
        found.contains(&"clock equals the user's tokens"),
        "{found:?}"
    );
    assert!(found.contains(&"row is logged"), "{found:?}");
}

/// The writer keeps each user's clock between captures; a raw write (a repair) is what the
/// next capture counts on, not the kept value.
#[test]
fn a_capture_counts_on_from_a_clock_written_raw() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), false);
    let capturer = Capturer::new(common::dictionary());
    let bob = UserId::from_key("bob");
    let say = |text: &str| {
        capturer
            .capture(&store, &[message("bob", "c1", Role::User, None, text)])
            .unwrap();
    };
    say("The first note about the garden.");
    let after_first = store.clock(bob).unwrap();
    assert!(after_first > 0);
    store
        .raw_put(Cf::Clock, &keys::user(bob), &1_000u64.to_le_bytes())
        .unwrap();
    let text = "A second note about the shed.";
    say(text);
    let tokens = perpetuity::tokens::Tokenizer::new().encode(text).len() as u64;
    assert_eq!(store.clock(bob).unwrap(), 1_000 + tokens);
}

#[test]
fn purge_removes_one_user_whole_and_leaves_others_identical() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), false);
    let capturer = Capturer::new(common::dictionary());
    let secret = "Xylophone-quartz-7731 is my locker code.";
    capturer
        .capture(
            &store,
            &[
                message("carol", "c1", Role::User, Some("Carol"), secret),
                message(
                    "dave",
                    "c1",
                    Role::User,
                    Some("Dave"),
                    "Dave likes sailing.",
                ),
                message("carol", "c2", Role::Assistant, None, "Noted, Carol."),
                message("dave", "c1", Role::Assistant, None, "Sailing where?"),
            ],
        )
        .unwrap();
    // Flush to SST files as a long-running store would have.
    drop(store);
    let store = open(dir.path(), false);
    assert!(!common::files_containing(dir.path(), b"Xylophone-quartz-7731").is_empty());

    let dave_before = exported(&store, "dave");
    let dave = UserId::from_key("dave");
    let dave_clock = store.clock(dave).unwrap();
    let removed = store.purge_user(UserId::from_key("carol")).unwrap();
    assert_eq!(removed, 2);

    assert!(exported(&store, "carol").is_empty());
    assert_eq!(exported(&store, "dave"), dave_before);
    assert_eq!(store.clock(dave).unwrap(), dave_clock);
    assert_eq!(store.user_key(UserId::from_key("carol")).unwrap(), None);
    assert_clean(&store);
    let hits = common::files_containing(dir.path(), b"Xylophone-quartz-7731");
    assert!(hits.is_empty(), "purged text still in {hits:?}");

    // Row ids keep growing after a purge.
    let ids = capturer
        .capture(
            &store,
            &[message("erin", "c1", Role::User, None, "New user.")],
        )
        .unwrap();
    assert_eq!(ids[0], [RowId(5)]);
    assert_clean(&store);
}

#[derive(Debug, Clone)]
enum Op {
    Capture {
        user: usize,
        text: usize,
        role: bool,
    },
    Purge {
        user: usize,
    },
    Reopen,
}

const USERS: [&str; 3] = ["u0", "u1", "u2"];
const TEXTS: [&str; 4] = [
    "Short note.",
    "We went to the lake on Sunday and swam until the sun set. It was cold!",
    "",
    "Numbers 1 2 3 and symbols ✓ ✗ mixed in.",
];

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..USERS.len(), 0..TEXTS.len(), any::<bool>())
            .prop_map(|(user, text, role)| Op::Capture { user, text, role }),
        1 => (0..USERS.len()).prop_map(|user| Op::Purge { user }),
        1 => Just(Op::Reopen),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// The store against an in-memory model: after any sequence of captures, purges and
    /// reopenings, each user's exported texts and clock equal the model's (a purge starts the
    /// clock afresh) and integrity is clean.
    #[test]
    fn store_matches_a_model(ops in proptest::collection::vec(op(), 1..25)) {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path(), true);
        let capturer = Capturer::new(common::dictionary());
        let mut model: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        let mut clocks: BTreeMap<&str, u64> = BTreeMap::new();
        let tokenizer = perpetuity::tokens::Tokenizer::new();
        for op in ops {
            match op {
                Op::Capture { user, text, role } => {
                    let role = if role { Role::User } else { Role::Assistant };
                    capturer
                        .capture(&store, &[message(USERS[user], "c", role, None, TEXTS[text])])
                        .unwrap();
                    if !TEXTS[text].is_empty() {
                        model.entry(USERS[user]).or_default().push(TEXTS[text]);
                    }
                    *clocks.entry(USERS[user]).or_default() +=
                        tokenizer.encode(TEXTS[text]).len() as u64;
                }
                Op::Purge { user } => {
                    store.purge_user(UserId::from_key(USERS[user])).unwrap();
                    model.remove(USERS[user]);
                    clocks.remove(USERS[user]);
                }
                Op::Reopen => {
                    drop(store);
                    store = open(dir.path(), true);
                }
            }
        }
        for user in USERS {
            let texts: Vec<String> = exported(&store, user)
                .iter()
                .map(|r| r["text"].as_str().unwrap().to_owned())
                .collect();
            let expected: Vec<String> =
                model.get(user).into_iter().flatten().map(|s| s.to_string()).collect();
            prop_assert_eq!(texts, expected);
            prop_assert_eq!(
                store.clock(UserId::from_key(user)).unwrap(),
                clocks.get(user).copied().unwrap_or(0)
            );
        }
        let report = integrity::check(&store, common::dictionary()).unwrap();
        prop_assert!(report.is_clean(), "{:#?}", report.violations);
    }
}
