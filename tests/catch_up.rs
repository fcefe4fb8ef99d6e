//! Requests that capture and recall at once: whichever of them catches the arena up, each one's
//! arena holds every row committed before it asked, its own question among them.

mod common;

use perpetuity::engine::{Author, Engine};
use perpetuity::scan::kernels::{Ceiling, Kernels};
use perpetuity::types::Role;

#[test]
fn every_caught_up_arena_holds_the_rows_committed_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, _, _) =
        Engine::open(common::memory(dir.path()), Kernels::detect(Ceiling::Native)).unwrap();
    let turns = 25;
    std::thread::scope(|scope| {
        for thread in 0..8 {
            let engine = &engine;
            scope.spawn(move || {
                let key = format!("user-{thread}");
                let mut mine = Vec::new();
                for turn in 0..turns {
                    let generation = engine.writing();
                    let author = Author {
                        user_key: &key,
                        conversation: "c",
                        since: generation.memory.store.purge_epoch(),
                        owner: None,
                    };
                    let text = format!("turn {turn} of thread {thread}: marker{thread}x{turn}");
                    let rows = generation.capture(&author, Role::User, None, text).unwrap();
                    mine.extend(rows.into_iter().flatten());
                    let arena = generation.caught_up().unwrap();
                    let missing: Vec<_> = mine
                        .iter()
                        .filter(|&&row| arena.slot(row).is_none())
                        .collect();
                    assert!(
                        missing.is_empty(),
                        "thread {thread} turn {turn}: rows {missing:?} not in the arena"
                    );
                }
                assert_eq!(mine.len(), turns, "one row a short message");
            });
        }
    });
    let generation = engine.generation();
    let arena = generation.caught_up().unwrap();
    assert_eq!(
        arena.scope_rows(&[perpetuity::types::UserId::from_key("user-0")]),
        turns
    );
}
