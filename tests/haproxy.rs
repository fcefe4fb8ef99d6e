//! Users sharded over three `perpetuity serve` nodes by HAProxy with the shipped configuration
//! (`deploy/haproxy/haproxy.cfg`, `deploy/README.md`), against one scripted upstream: users
//! spread over the nodes, each one's memory is recalled through the balancer and only its owner
//! stores it; one node killed (SIGKILL), its users are answered without memory
//! (`x-perpetuity-memory: unavailable`, the request forwarded untouched, nothing stored
//! anywhere) while the others' recall goes on; the node started again on its data, its users are
//! recalled again, what they told it before the kill included; an event stream passes both
//! HAProxy hops unbuffered. Says SKIP where HAProxy 2.6 or later is neither on PATH nor in
//! /usr/sbin (`tools/install-deps.sh` installs Debian's).

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::server::{Answer, free_port, request};
use common::upstream::{self, Upstream, chat_reply};
use perpetuity::proxy::identity::Secret;
use perpetuity::store::{Store, StoreOptions};
use perpetuity::types::{Role, UserId};
use tokio::sync::oneshot;

const CREDENTIAL: &str = "sk-haproxy-test";
const USERS: usize = 12;
/// How long HAProxy may take to see a node go down or come up, and a node to start.
const DEADLINE: Duration = Duration::from_secs(30);

fn user(i: usize) -> String {
    format!("agent-{i:02}")
}

/// The fact user `i` tells: a code no other user's memory holds.
fn code(i: usize) -> String {
    format!("quartz{}{i:02}", ["lamp", "fern", "kite", "moss"][i % 4])
}

/// A `perpetuity serve` node on a fixed loopback port and data directory, so that it can be
/// killed and started again where HAProxy expects it. Killed (SIGKILL) when dropped.
struct Node {
    child: Option<Child>,
    port: u16,
    data: PathBuf,
    log: PathBuf,
    upstream: String,
}

/// The server secret every node shares, as `deploy/haproxy/run.sh` gives them one: a
/// credential is keyed to the same user on each node.
const SHARED_SECRET: [u8; 32] = [0x5e; 32];

impl Node {
    fn start(dir: &Path, index: usize, upstream: &str) -> Self {
        let mut node = Self {
            child: None,
            port: free_port(),
            data: dir.join(format!("node{index}")),
            log: dir.join(format!("node{index}.log")),
            upstream: upstream.to_owned(),
        };
        std::fs::create_dir_all(&node.data).unwrap();
        std::fs::write(node.data.join("secret"), SHARED_SECRET).unwrap();
        node.restart();
        node
    }

    /// Spawn the server on the node's port and data, then wait until `/healthz` answers 200.
    fn restart(&mut self) {
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_perpetuity"))
            .args(["serve", "--listen", &format!("127.0.0.1:{}", self.port)])
            .args(["--data", self.data.to_str().unwrap()])
            .args(["--upstream", &format!("openai={}", self.upstream)])
            .env("RUST_LOG", "info")
            .env_remove("PERPETUITY_FAILPOINT")
            .env_remove("PERPETUITY_FAILPOINT_ERRORS")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let started = Instant::now();
        loop {
            if let Ok(health) = request(self.port, "GET", "/healthz", &[], b"")
                && health.status == 200
            {
                return;
            }
            let exited = self.child.as_mut().unwrap().try_wait().unwrap();
            assert!(
                exited.is_none() && started.elapsed() < DEADLINE,
                "node on port {} did not come up ({exited:?}); its log:\n{}",
                self.port,
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL: nothing is flushed, no destructor runs.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Chat requests this node has served since it started (its own `/metrics`).
    fn chat_requests(&self) -> u64 {
        let metrics = request(self.port, "GET", "/metrics", &[], b"")
            .unwrap()
            .text();
        metrics
            .lines()
            .find_map(|line| line.strip_prefix("perpetuity_requests_total{route=\"openai_chat\"} "))
            .expect("the chat route's request counter")
            .trim()
            .parse()
            .unwrap()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// HAProxy running the shipped configuration, killed when dropped.
struct Balancer {
    child: Child,
    port: u16,
    stats: u16,
    log: PathBuf,
}

impl Balancer {
    fn start(haproxy: &str, dir: &Path, nodes: &[Node]) -> Self {
        let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/haproxy/haproxy.cfg");
        let (port, stats) = (free_port(), free_port());
        let log = dir.join("haproxy.log");
        let mut command = Command::new(haproxy);
        command
            .arg("-db")
            .arg("-f")
            .arg(&config)
            .env("PERPETUITY_LB_LISTEN", format!("127.0.0.1:{port}"))
            .env("PERPETUITY_LB_STATS", format!("127.0.0.1:{stats}"))
            .env(
                "PERPETUITY_LB_NAME",
                format!("perpetuity-test-{}-{port}", std::process::id()),
            )
            .env("PERPETUITY_LB_KEY", "user")
            .env("PERPETUITY_LB_CHECK_INTER", "100ms")
            .env("PERPETUITY_LB_CHECK_FALL", "2")
            .env("PERPETUITY_LB_CHECK_RISE", "1");
        for (i, node) in nodes.iter().enumerate() {
            command.env(
                format!("PERPETUITY_NODE{i}"),
                format!("127.0.0.1:{}", node.port),
            );
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut balancer = Self {
            child,
            port,
            stats,
            log,
        };
        for i in 0..nodes.len() {
            balancer.wait_for(i, "UP");
        }
        balancer
    }

    /// HAProxy's view of node `index`: `UP`, `DOWN`, or a transition (`UP 1/2`), from its
    /// statistics page; `None` while the page does not answer.
    fn status(&self, index: usize) -> Option<String> {
        let page = request(self.stats, "GET", "/stats;csv", &[], b"").ok()?;
        let header = page.text().lines().next()?.to_owned();
        let column = header
            .trim_start_matches("# ")
            .split(',')
            .position(|name| name == "status")?;
        let row = format!("node{index},node{index},");
        page.text()
            .lines()
            .find(|line| line.starts_with(&row))
            .and_then(|line| line.split(',').nth(column))
            .map(str::to_owned)
    }

    /// Poll the statistics until HAProxy's health checks have marked node `index` `status`.
    fn wait_for(&mut self, index: usize, status: &str) {
        let started = Instant::now();
        loop {
            let seen = self.status(index);
            if seen.as_deref() == Some(status) {
                return;
            }
            let exited = self.child.try_wait().unwrap();
            assert!(
                exited.is_none() && started.elapsed() < DEADLINE,
                "HAProxy did not mark node{index} {status} (last seen {seen:?}, exited {exited:?}); its log:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A non-streamed Chat Completions request of `user` through the balancer.
    fn chat(&self, user: &str, conversation: &str, body: &[u8]) -> Answer {
        let auth = format!("Bearer {CREDENTIAL}");
        let answer = request(
            self.port,
            "POST",
            "/v1/chat/completions",
            &[
                ("authorization", &auth),
                ("content-type", "application/json"),
                ("x-perpetuity-user", user),
                ("x-perpetuity-conversation", conversation),
            ],
            body,
        )
        .unwrap();
        assert_eq!(answer.status, 200, "{user}: {}", answer.text());
        answer
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn chat_body(text: &str) -> Vec<u8> {
    serde_json::json!({"model": "gpt-test", "messages": [{"role": "user", "content": text}]})
        .to_string()
        .into_bytes()
}

fn question(phase: &str, i: usize) -> String {
    format!("Question {phase} from {}: what is my locker code?", user(i))
}

/// The request the upstream received carrying `text` (exactly one).
fn received_with(upstream: &Upstream, text: &str) -> upstream::Received {
    let mut found: Vec<_> = upstream
        .received()
        .into_iter()
        .filter(|r| r.text().contains(text))
        .collect();
    assert_eq!(found.len(), 1, "requests upstream carrying {text:?}");
    found.pop().unwrap()
}

/// Ask user `i` through the balancer; its answer used the memory, and the request the upstream
/// received holds the user's own code in the recalled frame and no other user's.
fn assert_recalled(balancer: &Balancer, upstream: &Upstream, phase: &str, i: usize) {
    let asked = question(phase, i);
    let answer = balancer.chat(&user(i), phase, &chat_body(&asked));
    assert_eq!(
        answer.header("x-perpetuity-memory"),
        Some("ok"),
        "{phase}: {}",
        user(i)
    );
    let sent = received_with(upstream, &asked).text();
    assert!(
        sent.contains(&code(i)),
        "{phase}: {}'s code is not in the frame it was sent with: {sent}",
        user(i)
    );
    for other in (0..USERS).filter(|&other| other != i) {
        assert!(
            !sent.contains(&code(other)),
            "{phase}: {}'s frame holds {}'s code",
            user(i),
            user(other)
        );
    }
}

/// Stream a reply through the balancer whose second half the upstream holds back until the
/// first half has reached the client: neither HAProxy hop buffers an event stream.
fn assert_stream_unbuffered(balancer: &Balancer, release: oneshot::Sender<()>) {
    let mut stream = TcpStream::connect(("127.0.0.1", balancer.port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let body = serde_json::json!({
        "model": "gpt-test",
        "stream": true,
        "messages": [{"role": "user", "content": "STREAM-CHECK: tell me a story."}],
    })
    .to_string();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\
         Authorization: Bearer {CREDENTIAL}\r\nContent-Type: application/json\r\n\
         x-perpetuity-user: {}\r\nContent-Length: {}\r\n\r\n",
        user(0),
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let mut chunk = [0u8; 4096];
    let contains = |raw: &[u8], needle: &[u8]| raw.windows(needle.len()).any(|w| w == needle);
    while !contains(&raw, b"first-half") {
        let n = stream
            .read(&mut chunk)
            .expect("the stream's first half arrives while the second is held back");
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&raw));
        raw.extend_from_slice(&chunk[..n]);
    }
    assert!(!contains(&raw, b"second-half"));
    release.send(()).unwrap();
    stream.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        text.contains("second-half") && text.contains("[DONE]"),
        "{text}"
    );
}

/// The HAProxy binary (on PATH, else Debian's `/usr/sbin/haproxy`, which a user's PATH may
/// lack) and its version (major, minor), or `None` where there is none.
fn haproxy() -> Option<(String, (u32, u32))> {
    ["haproxy", "/usr/sbin/haproxy"]
        .into_iter()
        .find_map(|binary| {
            let output = Command::new(binary).arg("-v").output().ok()?;
            let text = String::from_utf8_lossy(&output.stdout).into_owned();
            // "HAProxy version 2.6.12-1+deb12u4 2026/10/17 - https://haproxy.org/"
            let mut numbers = text.split_whitespace().nth(2)?.split(['.', '-']);
            let version = (numbers.next()?.parse().ok()?, numbers.next()?.parse().ok()?);
            Some((binary.to_owned(), version))
        })
}

fn sse_event(content: &str) -> String {
    format!(
        "data: {}\n\n",
        serde_json::json!({"choices": [{"index": 0, "delta": {"content": content}}]})
    )
}

#[test]
fn users_shard_over_three_nodes_behind_haproxy_and_survive_a_node_loss() {
    let Some((haproxy, version)) = haproxy() else {
        eprintln!(
            "SKIP haproxy test: haproxy is neither on PATH nor in /usr/sbin; tools/install-deps.sh installs it"
        );
        return;
    };
    if version < (2, 6) {
        eprintln!("SKIP haproxy test: HAProxy 2.6 or later is needed, {haproxy} is {version:?}");
        return;
    }
    let started = Instant::now();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = runtime.block_on(Upstream::start());
    let (release, held) = oneshot::channel();
    let held = Mutex::new(Some(held));
    upstream.respond_with(Arc::new(move |_, received| {
        if received.json()["stream"] == true {
            let go = held.lock().unwrap().take().expect("one streamed request");
            upstream::Answer::Held(
                sse_event("first-half").into_bytes(),
                format!(
                    "{}data: {}\n\ndata: [DONE]\n\n",
                    sse_event(" second-half"),
                    serde_json::json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
                )
                .into_bytes(),
                go,
            )
        } else {
            chat_reply("Noted.")
        }
    }));
    let dir = tempfile::tempdir().unwrap();
    let mut nodes: Vec<Node> = (0..3)
        .map(|i| Node::start(dir.path(), i, &upstream.url()))
        .collect();
    let mut balancer = Balancer::start(&haproxy, dir.path(), &nodes);

    // A repeated identity header (which the balancer and a node would read differently, so a
    // client could pick its node) is refused by the balancer, before any node.
    for (name, first, second) in [
        ("authorization", "Bearer sk-balanced", "Basic anVuaw=="),
        ("x-perpetuity-user", "alice", "bob"),
        ("x-api-key", "ak-1", "ak-2"),
        ("x-goog-api-key", "g-1", "g-2"),
    ] {
        let before: Vec<u64> = nodes.iter().map(Node::chat_requests).collect();
        let answer = request(
            balancer.port,
            "POST",
            "/v1/chat/completions",
            &[
                ("authorization", "Bearer sk-balanced"),
                (name, first),
                (name, second),
            ],
            &chat_body("Which node am I on?"),
        )
        .unwrap();
        assert_eq!(answer.status, 400, "{name} twice: {}", answer.text());
        assert!(answer.text().contains("repeated"), "{}", answer.text());
        let after: Vec<u64> = nodes.iter().map(Node::chat_requests).collect();
        assert_eq!(before, after, "{name} twice reached a node");
    }

    // Each user tells its code through the balancer; the node whose chat counter moved owns it.
    let owner: Vec<usize> = (0..USERS)
        .map(|i| {
            let before: Vec<u64> = nodes.iter().map(Node::chat_requests).collect();
            let told = format!("My locker code is {}.", code(i));
            let answer = balancer.chat(&user(i), "tell", &chat_body(&told));
            assert_eq!(answer.header("x-perpetuity-memory"), Some("ok"));
            assert!(
                answer
                    .header("x-perpetuity-captured")
                    .is_some_and(|c| c.contains("question")),
                "{}: the fact was not acknowledged stored: {:?}",
                user(i),
                answer.headers
            );
            let moved: Vec<usize> = (0..nodes.len())
                .filter(|&n| nodes[n].chat_requests() != before[n])
                .collect();
            assert_eq!(moved.len(), 1, "{}: served by nodes {moved:?}", user(i));
            moved[0]
        })
        .collect();
    let owners: BTreeSet<usize> = owner.iter().copied().collect();
    assert!(
        owners.len() >= 2,
        "every user landed on one node: {owner:?}"
    );
    println!("owners of {USERS} users: {owner:?}");

    // Everyone's memory is recalled through the balancer; the same user always reaches the
    // same node.
    for i in 0..USERS {
        let before = nodes[owner[i]].chat_requests();
        assert_recalled(&balancer, &upstream, "before", i);
        assert_eq!(nodes[owner[i]].chat_requests(), before + 1, "{}", user(i));
    }
    assert_stream_unbuffered(&balancer, release);

    // The node owning the most users is killed.
    let lost = (0..nodes.len())
        .max_by_key(|&n| owner.iter().filter(|&&o| o == n).count())
        .unwrap();
    nodes[lost].kill();
    balancer.wait_for(lost, "DOWN");
    for (i, &owned) in owner.iter().enumerate() {
        if owned == lost {
            // Answered without memory: forwarded untouched, stored nowhere.
            let asked = question("while-down", i);
            let body = chat_body(&asked);
            let answer = balancer.chat(&user(i), "while-down", &body);
            assert_eq!(
                answer.header("x-perpetuity-memory"),
                Some("unavailable"),
                "{}",
                user(i)
            );
            assert_eq!(answer.header("x-perpetuity-captured"), None);
            assert_eq!(answer.json()["choices"][0]["message"]["content"], "Noted.");
            let sent = received_with(&upstream, &asked);
            assert_eq!(
                sent.body,
                body,
                "{}: the request was not untouched",
                user(i)
            );
            assert!(
                sent.headers
                    .keys()
                    .all(|name| !name.as_str().starts_with("x-perpetuity")),
                "{:?}",
                sent.headers
            );
            // Its exclusions live on its owner: no other node answers for them.
            let auth = format!("Bearer {CREDENTIAL}");
            let exclusions = request(
                balancer.port,
                "GET",
                "/perpetuity/exclusions",
                &[("authorization", &auth), ("x-perpetuity-user", &user(i))],
                b"",
            )
            .unwrap();
            assert_eq!(exclusions.status, 503, "{}", exclusions.text());
            assert_eq!(
                exclusions.header("x-perpetuity-memory"),
                Some("unavailable")
            );
        } else {
            assert_recalled(&balancer, &upstream, "while-down", i);
        }
    }

    // Back on its data and port: its users are recalled again, from what it stored before.
    nodes[lost].restart();
    balancer.wait_for(lost, "UP");
    for i in 0..USERS {
        assert_recalled(&balancer, &upstream, "after", i);
    }

    // Each user's memory is on its owner alone, whole; a question asked while the owner was
    // down is stored nowhere.
    for node in &mut nodes {
        node.kill();
    }
    for (n, node) in nodes.iter().enumerate() {
        let store = Store::open(&node.data, &StoreOptions::default()).unwrap();
        let secret = Secret::load_or_create(&node.data).unwrap();
        for (i, &owned) in owner.iter().enumerate() {
            let id = UserId::from_key(&secret.user_key(CREDENTIAL, Some(&user(i))));
            let stored: Vec<String> = common::stored_messages(&store, id)
                .into_iter()
                .filter(|(role, _)| *role == Role::User)
                .map(|(_, text)| text)
                .collect();
            if owned != n {
                assert!(
                    stored.is_empty(),
                    "node{n} stored {} of {} (owned by node{owned})",
                    stored.len(),
                    user(i),
                );
                continue;
            }
            let mut expected = vec![
                format!("My locker code is {}.", code(i)),
                question("before", i),
            ];
            if i == 0 {
                expected.push("STREAM-CHECK: tell me a story.".to_owned());
            }
            if owned != lost {
                expected.push(question("while-down", i));
            }
            expected.push(question("after", i));
            assert_eq!(stored, expected, "node{n}, {}", user(i));
        }
    }
    drop(balancer);
    println!(
        "{USERS} users over {} nodes, node{lost} (owner of {}) lost and back: {:.1?}",
        owners.len(),
        owner.iter().filter(|&&o| o == lost).count(),
        started.elapsed()
    );
}
