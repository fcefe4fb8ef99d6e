//! The dictionary hot swap: re-deriving under the same table changes nothing but the version
//! tag (rows, heat, counts and every search untouched), and a swap to the real second version
//! (`dictionaries/v2`) while queries and captures run through the proxy: no query fails, every
//! answer came from one version (a client never sees the old one after the new), integrity is
//! clean, and every turn captured during the swap is in the new version's store and arena.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hyper::StatusCode;
use serde_json::{Value, json};

use common::upstream::{Answer, Harness, body_of, header};
use perpetuity::arena::Arena;
use perpetuity::capture::{Capturer, Message};
use perpetuity::config::default_dictionaries_root;
use perpetuity::dictionary::DEFAULT_VERSION;
use perpetuity::integrity;
use perpetuity::retrieve::{PreparedQuery, search};
use perpetuity::scan::kernels::{Ceiling, Kernels};
use perpetuity::store::Cf;
use perpetuity::swap;
use perpetuity::types::{Role, UserId};

const ADMIN: (&str, &str) = ("x-perpetuity-admin-token", "swap-admin");
const QUESTIONS: [&str; 4] = [
    "Where did Mira plant the apple trees?",
    "Which train did the team take to the harbour?",
    "What colour was the kite at the festival?",
    "Who repaired the violin last winter?",
];

/// A few thousand messages of one user, about varied things.
fn seed(user_key: &str, messages: usize) -> Vec<Message> {
    let subjects = ["Mira", "the team", "Jonas", "our neighbour", "the choir"];
    let verbs = ["planted", "painted", "repaired", "carried", "found"];
    let objects = [
        "the apple trees by the river",
        "a red kite for the festival",
        "the old violin",
        "the night train to the harbour",
        "a map of the northern hills",
    ];
    (0..messages)
        .map(|i| Message {
            user_key: user_key.into(),
            conversation: format!("c{}", i / 40),
            role: if i % 2 == 0 {
                Role::User
            } else {
                Role::Assistant
            },
            name: None,
            timestamp_ms: Some(1_700_000_000_000 + i as i64 * 60_000),
            source_turn: None,
            text: format!(
                "Note {i}: {} {} {} {} days ago.",
                subjects[i % 5],
                verbs[(i / 5) % 5],
                objects[(i / 25) % 5],
                i % 17
            ),
        })
        .collect()
}

/// The version name the default version's table is installed under again.
const AGAIN: &str = "same-table";

/// A copy of the default version's folder in `target` under another version name (the same
/// table).
fn same_table(target: PathBuf, version: &str) -> PathBuf {
    let source = default_dictionaries_root().join(DEFAULT_VERSION);
    std::fs::create_dir_all(&target).unwrap();
    for entry in std::fs::read_dir(&source).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), target.join(entry.file_name())).unwrap();
    }
    let manifest = target.join("dictionary.json");
    let mut header: Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    header["version"] = json!(version);
    std::fs::write(&manifest, serde_json::to_vec_pretty(&header).unwrap()).unwrap();
    target
}

/// A raw key and value.
type Entry = (Box<[u8]>, Box<[u8]>);

/// Every entry of a family, raw.
fn entries(store: &perpetuity::store::Store, cf: Cf) -> Vec<Entry> {
    store.iter_all(cf).collect::<Result<_, _>>().unwrap()
}

#[test]
fn rederiving_under_the_same_table_changes_nothing_but_the_tag() {
    let dir = tempfile::tempdir().unwrap();
    let tables = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let memory = common::memory(&data);
    let user = "same-table-user";
    Capturer::new(&memory.dictionary)
        .capture(&memory.store, &seed(user, 600))
        .unwrap();
    let kernels = Kernels::detect(Ceiling::Native);
    let searched = |memory: &perpetuity::memory::Memory, arena: &Arena| -> Vec<Vec<u64>> {
        QUESTIONS
            .iter()
            .map(|q| {
                let query = PreparedQuery::new(&memory.dictionary, arena, q);
                search(
                    &memory.dictionary,
                    arena,
                    &kernels,
                    &[UserId::from_key(user)],
                    &query,
                    20,
                )
                .iter()
                .map(|hit| hit.row.0)
                .collect()
            })
            .collect()
    };
    let (mut arena, _) = Arena::open(&memory.store, &memory.dictionary).unwrap();
    arena.catch_up(&memory.store, &memory.dictionary).unwrap();
    let before = searched(&memory, &arena);
    let untouched = [Cf::Rows, Cf::Activation, Cf::Warm, Cf::Clock, Cf::Log];
    let kept: Vec<_> = untouched
        .iter()
        .map(|&cf| entries(&memory.store, cf))
        .collect();
    let counts = entries(&memory.store, Cf::Counts);
    let retrieval = entries(&memory.store, Cf::Retrieval);

    let table = same_table(tables.path().join(AGAIN), AGAIN);
    let installed = swap::install(&memory.store, &table).unwrap();
    // Half-derived is progress, not damage.
    let step = memory.store.rederive_step(100).unwrap();
    assert_eq!(
        (step.done, step.total, step.is_derived()),
        (100, 600, false)
    );
    assert!(
        integrity::check(&memory.store, &memory.dictionary)
            .unwrap()
            .is_clean()
    );
    let listed = swap::list(&memory.store).unwrap();
    assert!(
        listed
            .iter()
            .any(|l| l.to_string() == format!("{AGAIN}\tderiving 100/600")),
        "{listed:?}"
    );
    let state = swap::rederive(&memory.store, |_| {}).unwrap();
    assert_eq!((state.done, state.is_derived()), (600, true));
    assert_eq!(
        memory.store.rederive_step(100).unwrap(),
        state,
        "nothing left to re-derive"
    );
    let mut dark = swap::build_arena(&memory.store, &installed).unwrap();
    swap::flip(&memory.store, &installed, &mut dark).unwrap();

    assert_eq!(
        memory.store.dictionary_version().unwrap().as_deref(),
        Some(AGAIN)
    );
    for (cf, before) in untouched.iter().zip(&kept) {
        assert_eq!(
            &entries(&memory.store, *cf),
            before,
            "{} rewritten",
            cf.name()
        );
    }
    assert_eq!(entries(&memory.store, Cf::Counts), counts, "counts changed");
    let after = entries(&memory.store, Cf::Retrieval);
    assert_eq!(after.len(), retrieval.len());
    for ((key, old), (new_key, new)) in retrieval.iter().zip(&after) {
        assert_eq!(key, new_key);
        let (mut old, new) = (
            perpetuity::dictionary::derive::RetrievalRow::decode(old).unwrap(),
            perpetuity::dictionary::derive::RetrievalRow::decode(new).unwrap(),
        );
        old.dictionary_version = AGAIN.into();
        assert_eq!(old, new);
    }
    assert!(entries(&memory.store, Cf::DarkRetrieval).is_empty());
    assert!(entries(&memory.store, Cf::DarkCounts).is_empty());
    assert!(
        !data.join("arena").join(DEFAULT_VERSION).exists(),
        "the retired arena is dropped"
    );
    let flipped = perpetuity::memory::Memory {
        store: Arc::clone(&memory.store),
        dictionary: installed,
    };
    assert_eq!(searched(&flipped, &dark), before, "every search unchanged");
    assert!(
        integrity::check(&memory.store, &flipped.dictionary)
            .unwrap()
            .is_clean()
    );
    // Listed in version name order.
    let states: Vec<String> = swap::list(&memory.store)
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        states,
        [
            format!("{AGAIN}\tserving"),
            format!("{DEFAULT_VERSION}\tretired")
        ]
    );
}

/// One chat request; its status, memory status and dictionary version.
async fn chat(
    h: &Harness,
    credential: &str,
    text: &str,
    probe: bool,
) -> (StatusCode, String, String) {
    let body = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": text}]});
    let auth = format!("Bearer {credential}");
    let mut headers = vec![
        ("authorization", auth.as_str()),
        ("content-type", "application/json"),
    ];
    if probe {
        headers.push(("x-perpetuity-probe", "true"));
    }
    let response = h
        .send(
            "POST",
            "/v1/chat/completions",
            &headers,
            body.to_string().as_bytes(),
        )
        .await;
    let status = response.status();
    let memory = header(&response, "x-perpetuity-memory").to_owned();
    let version = header(&response, "x-perpetuity-dictionary").to_owned();
    body_of(response).await;
    (status, memory, version)
}

async fn admin(h: &Harness, method: &str, path: &str) -> (StatusCode, Value) {
    let response = h.send(method, path, &[ADMIN], b"").await;
    let status = response.status();
    (
        status,
        serde_json::from_slice(&body_of(response).await).unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_swap_under_concurrent_queries_and_captures_is_atomic_and_complete() {
    let h = Arc::new(Harness::start(|config| config.admin_token = Some(ADMIN.1.into())).await);
    let credential = "sk-swap-user";
    let user_key = h.state.secret.user_key(credential, None);
    {
        let generation = h.state.engine.generation();
        Capturer::new(&generation.memory.dictionary)
            .capture(&generation.memory.store, &seed(&user_key, 3000))
            .unwrap();
    }
    let reply = json!({"choices": [{"message": {"content": "Noted."}}]}).to_string();
    for _ in 0..4000 {
        h.answer(Answer::Whole(
            200,
            "application/json",
            reply.clone().into_bytes(),
        ));
    }

    let flipped = Arc::new(AtomicBool::new(false));
    let mut load = Vec::new();
    for worker in 0..4 {
        let (h, flipped) = (Arc::clone(&h), Arc::clone(&flipped));
        load.push(tokio::spawn(async move {
            // Queries (probe) and captures, until a while after the flip.
            let (mut versions, mut captured) = (Vec::new(), Vec::new());
            let mut after = 0;
            for i in 0.. {
                let probe = worker % 2 == 0;
                let text = if probe {
                    QUESTIONS[i % QUESTIONS.len()].to_owned()
                } else {
                    format!("Capture {worker}-{i}: the lighthouse keeper counted {i} gulls.")
                };
                let (status, memory, version) = chat(&h, credential, &text, probe).await;
                assert_eq!(status, StatusCode::OK);
                assert_eq!(memory, "ok", "no query or capture fails during the swap");
                if !probe {
                    captured.push((text, version.clone()));
                }
                versions.push(version);
                if flipped.load(Ordering::SeqCst) {
                    after += 1;
                    if after == 20 {
                        break;
                    }
                }
            }
            (versions, captured)
        }));
    }

    let v2 = default_dictionaries_root().join("v2");
    let (status, listed) = admin(
        &h,
        "POST",
        &format!("/admin/dictionary/install?path={}", v2.display()),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{listed}");
    let started = Instant::now();
    let flip = loop {
        let (status, body) = admin(&h, "POST", "/admin/dictionary/flip?version=v2").await;
        if status == StatusCode::OK {
            break body;
        }
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "v2 never became ready"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    flipped.store(true, Ordering::SeqCst);
    assert_eq!(flip["serving"], "v2");
    assert_eq!(flip["retired"], DEFAULT_VERSION);

    let mut captured = Vec::new();
    for task in load {
        let (versions, mine) = task.await.unwrap();
        let first_v2 = versions
            .iter()
            .position(|v| v == "v2")
            .expect("answers after the flip");
        assert!(
            versions[..first_v2].iter().all(|v| v == DEFAULT_VERSION)
                && versions[first_v2..].iter().all(|v| v == "v2"),
            "a client saw the old version after the new: {versions:?}"
        );
        captured.extend(mine);
    }
    assert!(
        captured.iter().any(|(_, v)| v == DEFAULT_VERSION),
        "captures ran before the flip"
    );

    let (status, report) = admin(&h, "GET", "/admin/integrity").await;
    assert_eq!(status, StatusCode::OK, "{report}");
    let generation = h.state.engine.generation();
    assert_eq!(generation.memory.dictionary.version(), "v2");
    {
        let store = &generation.memory.store;
        let arena = generation.arena.read();
        let rows = common::stored_messages(store, UserId::from_key(&user_key));
        for (text, _) in &captured {
            assert!(
                rows.iter().any(|(_, stored)| stored == text),
                "{text} stored"
            );
        }
        for row in store.rows_of(UserId::from_key(&user_key)) {
            let row = row.unwrap();
            let retrieval = store.retrieval(row.user, row.id).unwrap().unwrap();
            assert_eq!(retrieval.dictionary_version, "v2");
            assert!(
                arena.slot(row.id).is_some(),
                "row {} in the new arena",
                row.id.0
            );
        }
    }
    let (_, listed) = admin(&h, "GET", "/admin/dictionary").await;
    assert_eq!(
        listed["versions"],
        json!([{"version": "v2", "state": "serving"}, {"version": DEFAULT_VERSION, "state": "retired"}])
    );
}

/// A sentinel file in a folder of its own.
fn sentinel(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let file = dir.join("keep");
    std::fs::write(&file, b"still here").unwrap();
    file
}

/// A dictionary whose version would name a folder outside `<data>/dictionaries/` (the data
/// directory itself, a folder beside it or above it, an absolute path) is refused at every
/// entry, the command line and the admin endpoint (400), before any file is touched: the
/// store and every sentinel stay as they were. The functions that turn a version into a folder
/// refuse the same names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_that_names_a_path_outside_its_folder_is_refused_everywhere() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let tables = root.path().join("tables");
    let capture = |memory: &perpetuity::memory::Memory| {
        Capturer::new(&memory.dictionary)
            .capture(&memory.store, &seed("hostile-version-user", 40))
            .unwrap();
        memory.store.next_row()
    };
    let stored = capture(&common::memory(&data));
    let absolute = root.path().join("absolute");
    let sentinels = [
        sentinel(&data.join("victim")),
        sentinel(&root.path().join("victim")),
        sentinel(&absolute),
    ];
    let hostile = [
        "..".to_owned(),
        "../victim".to_owned(),
        "../../victim".to_owned(),
        absolute.to_str().unwrap().to_owned(),
        ".hidden".to_owned(),
        "a/b".to_owned(),
        "x".repeat(65),
    ];
    let check_untouched = |data: &Path| {
        for file in &sentinels {
            assert_eq!(std::fs::read(file).unwrap(), b"still here", "{file:?}");
        }
        let memory = common::memory(data);
        assert_eq!(memory.store.next_row(), stored, "the store is intact");
        assert!(
            swap::list(&memory.store)
                .unwrap()
                .iter()
                .all(|listed| listed.version == DEFAULT_VERSION),
            "nothing was installed"
        );
    };
    for (i, version) in hostile.iter().enumerate() {
        let table = same_table(tables.join(i.to_string()), version);
        let out = common::perpetuity(&[
            "dict",
            "install",
            "--data",
            data.to_str().unwrap(),
            table.to_str().unwrap(),
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{version} installed: {stderr}");
        assert!(
            stderr.contains("cannot name a folder"),
            "{version}: {stderr}"
        );
        check_untouched(&data);
        assert!(perpetuity::arena::arena_dir(&data, version).is_err());
        assert!(perpetuity::arena::remove_version(&data, version).is_err());
        assert!(perpetuity::memory::upload_dir(&data, version).is_err());
        assert!(
            perpetuity::dictionary::Dictionary::load_version(&tables.join("0"), version).is_err()
        );
    }
    check_untouched(&data);

    // The admin endpoint: 400, and the serving process's own data directory intact.
    let h = Harness::start(|config| config.admin_token = Some(ADMIN.1.into())).await;
    let served = capture(&h.state.engine.generation().memory);
    for (i, version) in hostile.iter().enumerate() {
        let table = tables.join(i.to_string());
        let (status, body) = admin(
            &h,
            "POST",
            &format!("/admin/dictionary/install?path={}", table.display()),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{version}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("cannot name a folder"),
            "{version}: {body}"
        );
    }
    let (status, report) = admin(&h, "GET", "/admin/integrity").await;
    assert_eq!(status, StatusCode::OK, "{report}");
    let (_, listed) = admin(&h, "GET", "/admin/dictionary").await;
    assert_eq!(
        listed["versions"],
        json!([{"version": DEFAULT_VERSION, "state": "serving"}])
    );
    assert_eq!(h.state.engine.generation().memory.store.next_row(), served);
    for file in &sentinels {
        assert_eq!(std::fs::read(file).unwrap(), b"still here", "{file:?}");
    }
}
