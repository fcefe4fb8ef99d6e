//! `perpetuity bench proxy --hostile`: a legitimate user's chat while one hostile request of
//! the security review (`docs/security.md`) runs at a time, against the same chat unloaded.
//! Each load runs without pause for the whole pass: a stranger's purge, an exclusion change
//! naming 16 million row ids, a chat body trickling in on every one of the `max_concurrent`
//! slots, and a 32 MiB inspector search. The legitimate user's calls are made one after the
//! other; their times to first byte, and every status that was not a success, are reported.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use http_body_util::{BodyExt as _, Full};
use hyper::Request;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpListener, TcpStream};

use super::load::{credential, one};
use super::{State, serve};
use crate::latency;

/// One hostile request of the review, run without pause while it is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Load {
    /// `POST /perpetuity/api/purge` by made-up credentials, each new.
    StrangerPurge,
    /// `POST /perpetuity/exclusions` naming 16 million row ids (about 140 MB), by the
    /// legitimate user's own credential.
    Exclusion16M,
    /// A chat request on every `max_concurrent` slot whose body arrives a byte a second.
    TricklingBodies,
    /// `POST /perpetuity/api/search` with a 32 MiB query, by the legitimate user's credential.
    Inspector32MiB,
}

impl Load {
    pub const ALL: [Self; 4] = [
        Self::StrangerPurge,
        Self::Exclusion16M,
        Self::TricklingBodies,
        Self::Inspector32MiB,
    ];
}

/// The legitimate user's calls in one pass.
#[derive(Debug, Clone, Serialize)]
pub struct Pass {
    /// The load that ran meanwhile (none: unloaded).
    pub load: Option<Load>,
    pub first_byte_p50_ms: f64,
    pub first_byte_p99_ms: f64,
    pub first_byte_max_ms: f64,
    /// `p99 − the unloaded p99`.
    pub added_p99_ms: f64,
    /// Calls answered anything but 200, and of those 503 (no slot).
    pub failed: usize,
    pub unavailable: usize,
    /// The hostile requests answered meanwhile, and the statuses they got (status, count).
    pub hostile_answered: u64,
    pub hostile_statuses: Vec<(u16, u64)>,
}

/// What `bench proxy --hostile` measured.
#[derive(Debug, Clone, Serialize)]
pub struct HostileReport {
    pub rows: usize,
    pub scope_rows: usize,
    pub requests: usize,
    pub passes: Vec<Pass>,
    /// The largest `added_p99_ms` of the loaded passes.
    pub worst_added_p99_ms: f64,
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// The statuses a hostile load's requests got, counted.
#[derive(Default)]
struct Tally {
    answered: AtomicU64,
    statuses: parking_lot::Mutex<std::collections::BTreeMap<u16, u64>>,
}

impl Tally {
    fn note(&self, status: u16) {
        self.answered.fetch_add(1, Ordering::Relaxed);
        *self.statuses.lock().entry(status).or_default() += 1;
    }
}

/// Run `requests` of the legitimate user's calls through a proxy serving `state` (whose OpenAI
/// upstream answers at once), unloaded and then under each [`Load`]; `questions` are asked in
/// turn. The store holds `(rows, scope_rows)`.
pub async fn measure(
    state: Arc<State>,
    (rows, scope_rows): (usize, usize),
    requests: usize,
    questions: &[String],
) -> std::io::Result<HostileReport> {
    let slots = state.config.max_concurrent;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let proxy = listener.local_addr()?;
    tokio::spawn(serve(listener, state));
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: HttpClient = Client::builder(TokioExecutor::new()).build(connector);
    // The legitimate user: vouched for by the upstream's success, and warmed.
    calls(&client, proxy, 20.min(requests), questions, "warm").await;
    let mut passes = Vec::new();
    let unloaded = calls(&client, proxy, requests, questions, "unloaded").await;
    let base = unloaded.first_byte_p99_ms;
    passes.push(Pass {
        added_p99_ms: 0.0,
        ..unloaded
    });
    for load in Load::ALL {
        let stop = Arc::new(AtomicBool::new(false));
        let tally = Arc::new(Tally::default());
        let running = start(load, &client, proxy, slots, &stop, &tally).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut pass = calls(&client, proxy, requests, questions, "loaded").await;
        stop.store(true, Ordering::Relaxed);
        for task in running {
            task.abort();
        }
        pass.load = Some(load);
        pass.added_p99_ms = pass.first_byte_p99_ms - base;
        pass.hostile_answered = tally.answered.load(Ordering::Relaxed);
        pass.hostile_statuses = tally.statuses.lock().clone().into_iter().collect();
        passes.push(pass);
        // Let the trickling connections close before the next pass.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let worst_added_p99_ms = passes
        .iter()
        .skip(1)
        .map(|p| p.added_p99_ms)
        .fold(f64::NEG_INFINITY, f64::max);
    Ok(HostileReport {
        rows,
        scope_rows,
        requests,
        passes,
        worst_added_p99_ms,
    })
}

/// The legitimate user's `requests` calls, one after the other.
async fn calls(
    client: &HttpClient,
    proxy: SocketAddr,
    requests: usize,
    questions: &[String],
    pass: &str,
) -> Pass {
    let mut first = latency::histogram();
    let (mut failed, mut unavailable, mut most) = (0, 0, Duration::ZERO);
    let user = credential(0);
    for i in 0..requests {
        let conversation = format!("hostile {pass} {i}");
        let question = &questions[i % questions.len()];
        let (status, to_first, _) =
            one(client, proxy, true, (&user, &conversation), question).await;
        latency::record(&mut first, to_first);
        most = most.max(to_first);
        if status != 200 {
            failed += 1;
        }
        if status == 503 {
            unavailable += 1;
        }
    }
    Pass {
        load: None,
        first_byte_p50_ms: latency::ms(&first, 0.5),
        first_byte_p99_ms: latency::ms(&first, 0.99),
        first_byte_max_ms: most.as_secs_f64() * 1e3,
        added_p99_ms: 0.0,
        failed,
        unavailable,
        hostile_answered: 0,
        hostile_statuses: Vec::new(),
    }
}

/// Start `load` against `proxy`; its tasks, which run until `stop` (or are aborted).
async fn start(
    load: Load,
    client: &HttpClient,
    proxy: SocketAddr,
    slots: usize,
    stop: &Arc<AtomicBool>,
    tally: &Arc<Tally>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let posting = |path: &'static str, body: Bytes, made_up: bool| {
        let (client, stop, tally) = (client.clone(), Arc::clone(stop), Arc::clone(tally));
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let key = if made_up {
                    format!("made-up-{n}")
                } else {
                    credential(0)
                };
                let request = Request::post(format!("http://{proxy}{path}"))
                    .header("authorization", format!("Bearer {key}"))
                    .header("content-type", "application/json")
                    .body(Full::new(body.clone()))
                    .expect("a valid request");
                match client.request(request).await {
                    Ok(answer) => {
                        tally.note(answer.status().as_u16());
                        let _ = answer.into_body().collect().await;
                    }
                    // The proxy may close the connection once it has refused the body.
                    Err(_) => tally.note(0),
                }
            }
        })
    };
    match load {
        Load::StrangerPurge => vec![posting(
            "/perpetuity/api/purge",
            Bytes::from_static(b"{\"confirm\": \"x\"}"),
            true,
        )],
        Load::Exclusion16M => {
            let mut body = String::with_capacity(150 << 20);
            body.push_str("{\"rows\": [");
            for id in 0..16_000_000u64 {
                if id > 0 {
                    body.push(',');
                }
                body.push_str(&id.to_string());
            }
            body.push_str("]}");
            vec![posting("/perpetuity/exclusions", Bytes::from(body), false)]
        }
        Load::Inspector32MiB => {
            let query = "word ".repeat((32 << 20) / 5);
            let body = serde_json::json!({"query": query}).to_string();
            vec![posting("/perpetuity/api/search", Bytes::from(body), false)]
        }
        Load::TricklingBodies => (0..slots)
            .map(|n| {
                let (stop, tally) = (Arc::clone(stop), Arc::clone(tally));
                tokio::spawn(async move {
                    let Ok(mut stream) = TcpStream::connect(proxy).await else {
                        tally.note(0);
                        return;
                    };
                    let head = format!(
                        "POST /v1/chat/completions HTTP/1.1\r\nhost: {proxy}\r\nauthorization: Bearer trickle-{n}\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n{{"
                    );
                    if stream.write_all(head.as_bytes()).await.is_err() {
                        tally.note(0);
                        return;
                    }
                    while !stop.load(Ordering::Relaxed) {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        if stream.write_all(b" ").await.is_err() {
                            tally.note(0);
                            return;
                        }
                    }
                })
            })
            .collect(),
    }
}
