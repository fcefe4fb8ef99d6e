//! Isolation in one pooled memory: many users store unique canaries through the proxy, and no
//! retrieval, frame or upstream request of one user holds another's (0 of N); identical texts of
//! two users stay two rows; and no header (another user's key or name, another conversation, a
//! missing or conflicting credential) and no admin call without the token reaches another
//! credential's memory.

mod common;

use std::collections::BTreeMap;

use hyper::StatusCode;
use serde_json::{Value, json};

use common::upstream::{Answer, Harness, body_of, chat_reply, chat_request, header};
use perpetuity::memory_tools::{Call, TurnState};
use perpetuity::proxy::ProxyConfig;
use perpetuity::proxy::identity::Groups;
use perpetuity::recall::{Ask, RecallConfig, recall};
use perpetuity::types::{RowId, UserId};

/// Users in the pool: credentials, and on the last credential narrowed users.
const CREDENTIALS: usize = 12;
const NARROWED: [&str; 3] = ["ann", "ben", "cat"];
/// Said by every user, word for word.
const SHARED: &str = "We agreed to meet at the old harbour at noon on Friday.";
const QUESTION: &str = "What is the vault code of the project, and where do we meet?";

/// One user of the pool: the credential and, for narrowed users, the `x-perpetuity-user` name.
#[derive(Debug, Clone)]
struct Tenant {
    credential: String,
    narrow: Option<&'static str>,
}

impl Tenant {
    fn headers(&self) -> Vec<(&str, &str)> {
        let mut headers = vec![("content-type", "application/json")];
        if let Some(name) = self.narrow {
            headers.push(("x-perpetuity-user", name));
        }
        headers
    }

    fn key(&self, h: &Harness) -> String {
        h.state.secret.user_key(&self.credential, self.narrow)
    }
}

fn tenants() -> Vec<Tenant> {
    let mut tenants: Vec<Tenant> = (0..CREDENTIALS)
        .map(|i| Tenant {
            credential: format!("sk-tenant-{i:02}"),
            narrow: None,
        })
        .collect();
    tenants.extend(NARROWED.iter().map(|name| Tenant {
        credential: "sk-shared-team-key".into(),
        narrow: Some(*name),
    }));
    tenants
}

/// The canaries of tenant `i`: a question's and a reply's, alike across tenants but for the
/// code, so a scan that crossed users would find them.
fn canaries(i: usize) -> [String; 2] {
    [
        format!("QX{i:02}VAULT{:06}", i * 7919 % 1_000_000),
        format!("QX{i:02}REPLY{:06}", i * 104_729 % 1_000_000),
    ]
}

/// One request of the spoofing matrix: what it tries, path, headers, body.
type Case<'a> = (&'a str, &'a str, Vec<(&'a str, &'a str)>, Vec<u8>);

/// Send `question` as `tenant` (credential as an OpenAI bearer), the upstream answering
/// `reply`; returns the body the upstream received.
async fn ask(h: &Harness, tenant: &Tenant, question: &str, reply: &str) -> String {
    ask_in(h, tenant, None, question, reply).await
}

/// [`ask`] in the named `conversation` (`x-perpetuity-conversation`), when given.
async fn ask_in(
    h: &Harness,
    tenant: &Tenant,
    conversation: Option<&str>,
    question: &str,
    reply: &str,
) -> String {
    h.answer(chat_reply(reply));
    let auth = format!("Bearer {}", tenant.credential);
    let mut headers = tenant.headers();
    headers.push(("authorization", &auth));
    if let Some(conversation) = conversation {
        headers.push(("x-perpetuity-conversation", conversation));
    }
    let response = h
        .send(
            "POST",
            "/v1/chat/completions",
            &headers,
            &chat_request(question),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(header(&response, "x-perpetuity-memory"), "ok");
    body_of(response).await;
    h.received().pop().unwrap().text()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_user_ever_sees_another_users_canary_and_identical_texts_stay_apart() {
    let h = Harness::start(|_| {}).await;
    let tenants = tenants();
    for (i, tenant) in tenants.iter().enumerate() {
        let [vault, reply] = canaries(i);
        ask(
            &h,
            tenant,
            &format!("Remember: the vault code of the project is {vault}."),
            &format!("Noted, the vault code is {reply}."),
        )
        .await;
        ask(&h, tenant, SHARED, "Friday at noon, the old harbour.").await;
    }

    // Every upstream request of a tenant: its own vault canary recalled, no other tenant's.
    let mut checked = 0;
    for (i, tenant) in tenants.iter().enumerate() {
        let sent = ask(&h, tenant, QUESTION, "Let me look.").await;
        assert!(
            sent.contains(&canaries(i)[0]),
            "tenant {i}'s own canary is recalled (or the test proves nothing): {sent}"
        );
        for (j, _) in tenants.iter().enumerate().filter(|(j, _)| *j != i) {
            for canary in canaries(j) {
                assert!(
                    !sent.contains(&canary),
                    "tenant {i}'s upstream request holds tenant {j}'s {canary}"
                );
                checked += 1;
            }
        }
    }

    // Every retrieval and frame, asked directly in probe mode: only the tenant's rows.
    let generation = h.state.engine.generation();
    let memory = &generation.memory;
    generation
        .arena
        .write()
        .catch_up(&memory.store, &memory.dictionary)
        .unwrap();
    let arena = generation.arena.read();
    let (mut retrieved_rows, mut frames) = (0, 0);
    for (i, tenant) in tenants.iter().enumerate() {
        let user = UserId::from_key(&tenant.key(&h));
        let recalled = recall(
            memory,
            &arena,
            &h.state.engine.kernels,
            &RecallConfig::default(),
            &Ask {
                user,
                scope: &[user],
                conversation: None,
                question: QUESTION,
                probe: true,
                hidden: &[],
                now_ms: None,
                pin: None,
                sent_tokens: None,
            },
        )
        .unwrap();
        assert!(!recalled.retrieved.is_empty());
        for hit in &recalled.retrieved {
            assert_eq!(
                memory.store.user_of(RowId(hit.row)).unwrap(),
                Some(user),
                "tenant {i} retrieved row {} of another user",
                hit.row
            );
            retrieved_rows += 1;
        }
        let frame: String = recalled
            .frame
            .messages
            .iter()
            .map(|m| m.content.as_str())
            .collect();
        assert!(frame.contains(&canaries(i)[0]));
        for j in (0..tenants.len()).filter(|j| *j != i) {
            for canary in canaries(j) {
                assert!(
                    !frame.contains(&canary),
                    "tenant {i}'s frame holds {canary}"
                );
                checked += 1;
            }
        }
        frames += 1;
    }
    drop(arena);

    // The same words from every tenant: one row each, never merged.
    let mut shared_rows = Vec::new();
    for tenant in &tenants {
        let user = UserId::from_key(&tenant.key(&h));
        let rows: Vec<_> = memory
            .store
            .rows_of(user)
            .map(Result::unwrap)
            .filter(|row| row.text == SHARED)
            .collect();
        assert_eq!(rows.len(), 1, "{tenant:?}: {rows:?}");
        shared_rows.push(rows[0].id);
    }
    shared_rows.sort();
    shared_rows.dedup();
    assert_eq!(shared_rows.len(), tenants.len());
    println!(
        "{} tenants: {checked} foreign canary checks over upstream requests and frames, \
         {retrieved_rows} retrieved rows over {frames} retrievals: 0 crossed users",
        tenants.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_header_reaches_another_credentials_memory() {
    const TOKEN: &str = "admin-token-for-isolation";
    let h = Harness::start(|config| config.admin_token = Some(TOKEN.into())).await;
    let alice = Tenant {
        credential: "sk-alice-isolation".into(),
        narrow: None,
    };
    let secret = "QXALICEVAULT4417";
    let question = format!("Remember: the vault code of the project is {secret}.");
    h.answer(chat_reply("Noted."));
    let stored = h
        .send(
            "POST",
            "/v1/chat/completions",
            &[
                ("authorization", "Bearer sk-alice-isolation"),
                ("x-perpetuity-conversation", "alice-private"),
            ],
            &chat_request(&question),
        )
        .await;
    assert_eq!(stored.status(), StatusCode::OK);
    body_of(stored).await;
    let alice_rows = h.rows_of(&alice.credential, 2).len();
    assert_eq!(alice_rows, 2);
    let alice_key = alice.key(&h);
    let anthropic_body = json!({
        "model": "claude-haiku-4-5", "max_tokens": 16,
        "messages": [{"role": "user", "content": QUESTION}],
    })
    .to_string();
    let gemini_body =
        json!({"contents": [{"role": "user", "parts": [{"text": QUESTION}]}]}).to_string();
    let openai_path = "/v1/chat/completions";
    let gemini_path = "/v1beta/models/gemini-2.5-flash:generateContent?key=sk-alice-isolation";

    // Requests that reach the upstream: the memory recalled is never alice's.
    let forwarded: [Case; 6] = [
        (
            "alice's user key as the user name",
            openai_path,
            vec![
                ("authorization", "Bearer sk-mallory"),
                ("x-perpetuity-user", &alice_key),
            ],
            chat_request(QUESTION),
        ),
        (
            "alice's credential as the user name",
            openai_path,
            vec![
                ("authorization", "Bearer sk-mallory"),
                ("x-perpetuity-user", "sk-alice-isolation"),
            ],
            chat_request(QUESTION),
        ),
        (
            "alice's conversation",
            openai_path,
            vec![
                ("authorization", "Bearer sk-mallory"),
                ("x-perpetuity-conversation", "alice-private"),
            ],
            chat_request(QUESTION),
        ),
        (
            "OpenAI bearer mine, alice's Anthropic key beside it",
            openai_path,
            vec![
                ("authorization", "Bearer sk-mallory"),
                ("x-api-key", "sk-alice-isolation"),
            ],
            chat_request(QUESTION),
        ),
        (
            "Anthropic key mine, alice's in a Gemini header",
            "/v1/messages",
            vec![
                ("x-api-key", "sk-mallory"),
                ("anthropic-version", "2023-06-01"),
                ("x-goog-api-key", "sk-alice-isolation"),
            ],
            anthropic_body.clone().into_bytes(),
        ),
        (
            "alice's key as an admin token on a chat route",
            openai_path,
            vec![
                ("authorization", "Bearer sk-mallory"),
                ("x-perpetuity-admin-token", "sk-alice-isolation"),
            ],
            chat_request(QUESTION),
        ),
    ];
    for (case, path, headers, body) in &forwarded {
        h.answer(chat_reply("I do not know."));
        let mut headers = headers.clone();
        headers.push(("content-type", "application/json"));
        let response = h.send("POST", path, &headers, body).await;
        assert_eq!(response.status(), StatusCode::OK, "{case}");
        body_of(response).await;
        let sent = h.received().pop().unwrap().text();
        assert!(
            !sent.contains(secret),
            "{case}: alice's memory leaked: {sent}"
        );
    }

    // Refused before any memory is read or written, and never forwarded.
    let received = h.received().len();
    let next_row = h.state.engine.generation().memory.store.next_row();
    let refused: [Case; 5] = [
        (
            "no credential",
            openai_path,
            vec![("x-perpetuity-user", &alice_key)],
            chat_request(QUESTION),
        ),
        (
            "an empty bearer",
            openai_path,
            vec![("authorization", "Bearer  ")],
            chat_request(QUESTION),
        ),
        (
            "basic credentials",
            openai_path,
            vec![("authorization", "Basic c2stYWxpY2U=")],
            chat_request(QUESTION),
        ),
        (
            "Anthropic without a key",
            "/v1/messages",
            vec![("anthropic-version", "2023-06-01")],
            anthropic_body.into_bytes(),
        ),
        (
            "Gemini with an empty key",
            "/v1beta/models/gemini-2.5-flash:generateContent?key=",
            vec![("x-goog-api-key", " ")],
            gemini_body.clone().into_bytes(),
        ),
    ];
    for (case, path, headers, body) in &refused {
        let response = h.send("POST", path, headers, body).await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{case}");
        let error: Value = serde_json::from_slice(&body_of(response).await).unwrap();
        assert!(!error.to_string().contains(secret), "{case}");
    }
    // Two different credentials: which one names the memory is not guessed (`proxy.md`).
    let response = h
        .send(
            "POST",
            gemini_path,
            &[
                ("x-goog-api-key", "sk-mallory"),
                ("content-type", "application/json"),
            ],
            gemini_body.as_bytes(),
        )
        .await;
    assert_eq!(
        response.status(),
        StatusCode::BAD_REQUEST,
        "Gemini header mine, alice's key in the query"
    );
    let error: Value = serde_json::from_slice(&body_of(response).await).unwrap();
    assert!(!error.to_string().contains(secret));
    assert_eq!(
        h.received().len(),
        received,
        "refused requests are never forwarded"
    );
    assert_eq!(
        h.state.engine.generation().memory.store.next_row(),
        next_row,
        "nor stored"
    );

    // The admin endpoints without the token: refused, alice's memory untouched.
    let purge = format!("/admin/purge?user={alice_key}");
    let wrong_token = format!("Bearer {}", &TOKEN[..TOKEN.len() - 1]);
    let longer_token = format!("Bearer {TOKEN}x");
    for (method, path) in [
        ("GET", "/admin/stats"),
        ("GET", "/admin/integrity"),
        ("POST", purge.as_str()),
    ] {
        for headers in [
            vec![],
            vec![("authorization", "Bearer sk-alice-isolation")],
            vec![("authorization", wrong_token.as_str())],
            vec![("authorization", longer_token.as_str())],
            vec![("x-api-key", TOKEN)],
            vec![("x-perpetuity-user", TOKEN)],
            // A wrong dedicated header is not rescued by the right bearer.
            vec![
                ("x-perpetuity-admin-token", "nope"),
                ("authorization", &format!("Bearer {TOKEN}")),
            ],
        ] {
            let response = h.send(method, path, &headers, b"").await;
            assert_eq!(
                response.status(),
                StatusCode::UNAUTHORIZED,
                "{method} {path} with {headers:?}"
            );
            let body = String::from_utf8(body_of(response).await).unwrap();
            assert!(
                !body.contains(secret) && !body.contains(&alice_key),
                "{body}"
            );
        }
    }
    assert_eq!(h.rows_of(&alice.credential, alice_rows).len(), alice_rows);
    assert_eq!(h.received().len(), received);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_name_outside_ascii_narrows_like_any_other() {
    let h = Harness::start(|_| {}).await;
    let team = |narrow| Tenant {
        credential: "sk-shared-team-key".into(),
        narrow,
    };
    let (jose, zoe, base) = (team(Some("José")), team(Some("Zoë")), team(None));
    let [vault, _] = canaries(40);
    ask(
        &h,
        &jose,
        &format!("Remember: the vault code of the project is {vault}."),
        "Noted.",
    )
    .await;
    assert!(
        ask(&h, &jose, QUESTION, "Let me look.")
            .await
            .contains(&vault)
    );
    for other in [&zoe, &base] {
        let sent = ask(&h, other, QUESTION, "Let me look.").await;
        assert!(
            !sent.contains(&vault),
            "{other:?} sees José's memory: {sent}"
        );
    }
}

/// The group scope `team`: the planner and the coder of one credential.
fn team_of_planner_and_coder(config: &mut ProxyConfig) {
    config.groups = Groups::new(BTreeMap::from([(
        "team".to_owned(),
        vec!["planner".to_owned(), "coder".to_owned()],
    )]))
    .unwrap();
}

/// The user `name` of `credential` (`x-perpetuity-user`).
fn member(credential: &str, name: &'static str) -> Tenant {
    Tenant {
        credential: credential.to_owned(),
        narrow: Some(name),
    }
}

/// A group scope: the planner and the coder behind one team key search each other's memory;
/// the team's reviewer (in no group) does not, nor does any user of another credential, even one
/// with the same names (membership is by name under the asking credential); and a member's
/// recall never writes another member's heat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_scope_reads_its_members_and_nobody_else() {
    let h = Harness::start(team_of_planner_and_coder).await;
    let (planner, coder, reviewer) = (
        member("sk-team-key", "planner"),
        member("sk-team-key", "coder"),
        member("sk-team-key", "reviewer"),
    );
    let (other_planner, other_coder) = (
        member("sk-other-key", "planner"),
        member("sk-other-key", "coder"),
    );
    const TEAM: &str = "GRPTEAM4417";
    const OTHER: &str = "GRPOTHER9903";
    const ASK: &str = "What is the deploy passphrase of the project?";
    for (tenant, canary) in [(&planner, TEAM), (&other_planner, OTHER)] {
        ask(
            &h,
            tenant,
            &format!("Remember: the deploy passphrase of the project is {canary}."),
            "Noted.",
        )
        .await;
    }
    let generation = h.state.engine.generation();
    let store = &generation.memory.store;
    let planner_heat = |h: &Harness| -> Vec<_> {
        store
            .activations_of(UserId::from_key(&planner.key(h)))
            .collect::<Result<_, _>>()
            .unwrap()
    };
    let before = planner_heat(&h);

    let sent = ask(&h, &coder, ASK, "Let me look.").await;
    assert!(
        sent.contains(TEAM),
        "the coder's frame holds the planner's row: {sent}"
    );
    assert!(
        !sent.contains(OTHER),
        "another credential's planner leaked: {sent}"
    );
    assert_eq!(
        planner_heat(&h),
        before,
        "the coder's recall wrote the planner's heat"
    );

    let sent = ask(&h, &reviewer, ASK, "Let me look.").await;
    assert!(
        !sent.contains(TEAM) && !sent.contains(OTHER),
        "the reviewer is in no group: {sent}"
    );
    let sent = ask(&h, &other_coder, ASK, "Let me look.").await;
    assert!(
        sent.contains(OTHER),
        "the other key's team is its own group: {sent}"
    );
    assert!(!sent.contains(TEAM), "a group crossed credentials: {sent}");
}

/// A row its owner excluded stays out of the whole group scope: the planner excludes one of its
/// rows, and the coder's frame, a memory_search round of the coder's reply and the coder's
/// memory tools (search, chain) never show it, while the planner's other rows still are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_members_exclusions_hold_across_its_group_scope() {
    let h = Harness::start(team_of_planner_and_coder).await;
    let (planner, coder) = (
        member("sk-team-key", "planner"),
        member("sk-team-key", "coder"),
    );
    const HIDDEN: &str = "GRPHIDDEN5521";
    const KEPT: &str = "GRPKEPT7730";
    const ASK: &str = "What is the deploy passphrase of the project?";
    for canary in [HIDDEN, KEPT] {
        ask_in(
            &h,
            &planner,
            Some("deploys"),
            &format!("Remember: the deploy passphrase of the project is {canary}."),
            "Noted.",
        )
        .await;
    }
    let planner_user = UserId::from_key(&planner.key(&h));
    let coder_user = UserId::from_key(&coder.key(&h));
    let row_saying = |canary: &str| {
        h.state
            .engine
            .generation()
            .memory
            .store
            .rows_of(planner_user)
            .map(Result::unwrap)
            .find(|row| row.text.contains(canary))
            .unwrap()
            .id
    };
    let (hidden, kept) = (row_saying(HIDDEN), row_saying(KEPT));
    assert!(
        ask(&h, &coder, ASK, "Let me look.").await.contains(HIDDEN),
        "before the exclusion the coder's frame holds the planner's row (or the test proves nothing)"
    );

    let auth = format!("Bearer {}", planner.credential);
    let mut headers = planner.headers();
    headers.push(("authorization", &auth));
    let excluded = h
        .send(
            "POST",
            "/perpetuity/exclusions",
            &headers,
            json!({"rows": [hidden.0]}).to_string().as_bytes(),
        )
        .await;
    assert_eq!(excluded.status(), StatusCode::OK);
    let changed: Value = serde_json::from_slice(&body_of(excluded).await).unwrap();
    assert_eq!(changed["changed"], json!([hidden.0]));

    let sent = ask(&h, &coder, ASK, "Let me look.").await;
    assert!(
        !sent.contains(HIDDEN),
        "the coder's frame shows the excluded row: {sent}"
    );
    assert!(
        sent.contains(KEPT),
        "the planner's other row is still shown: {sent}"
    );

    let call = json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "memory_search", "arguments": "{\"query\": \"deploy passphrase of the project\"}"}}]}}]});
    h.answer(Answer::Whole(
        200,
        "application/json",
        call.to_string().into_bytes(),
    ));
    let before = h.received().len();
    let sent = ask(
        &h,
        &coder,
        "Search the memory for the deploy passphrase.",
        "Done.",
    )
    .await;
    let rounds = h.received();
    assert_eq!(
        rounds.len(),
        before + 2,
        "a memory_search round, then the answer"
    );
    let result = rounds[before + 1].json()["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(result.starts_with("memory_search: "), "{result}");
    for round in &rounds[before..] {
        assert!(
            !round.text().contains(HIDDEN),
            "the coder's memory_search round shows the excluded row: {}",
            round.text()
        );
    }
    assert!(sent.contains(KEPT), "{sent}");

    // The tools with nothing shown yet: the planner's kept row is reached, the excluded one
    // neither by a search nor as the kept row's neighbour in its conversation.
    let generation = h.state.engine.generation();
    let memory = &generation.memory;
    generation
        .arena
        .write()
        .catch_up(&memory.store, &memory.dictionary)
        .unwrap();
    let arena = generation.arena.read();
    let scope = [coder_user, planner_user];
    for call in [
        Call::Search {
            query: "deploy passphrase of the project".into(),
            limit: 10,
        },
        Call::Chain { item: kept },
    ] {
        let outcome = TurnState::new(coder_user, &scope, None, Vec::new(), &[])
            .run(memory, &arena, &h.state.engine.kernels, &call)
            .unwrap();
        assert!(outcome.rows.contains(&kept), "{call:?}: {}", outcome.text);
        assert!(
            !outcome.rows.contains(&hidden) && !outcome.text.contains(HIDDEN),
            "{call:?} shows the excluded row: {}",
            outcome.text
        );
    }
}
