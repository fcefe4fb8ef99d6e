//! `perpetuity bench proxy`: what the proxy adds to a streamed call. A local upstream answers
//! every request with a short recorded-shape stream, at once or after a given time to first
//! byte (a model's, which the proxy's own work may overlap); the same requests go to it
//! directly, through the proxy with memory, and through the proxy with recall off, at a given
//! concurrency. Time to first byte (the first body frame) and total time are recorded with
//! hdrhistogram, and the proxy's figures are reported beside the direct ones. The local
//! upstreams here also serve the other measurements through the proxy: one answering every
//! request alike (`bench prefix`), one answering each with the next of a script (`eval`'s
//! replay of recorded sessions).

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Serialize;
use tokio::net::TcpListener;

use super::{State, serve};
use crate::latency;

/// The stream the local upstream answers with: the shape of an OpenAI chat stream.
const STREAM: &str = "data: {\"id\":\"bench\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n\
data: {\"id\":\"bench\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Noted, thank you.\"}}]}\n\n\
data: {\"id\":\"bench\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
data: [DONE]\n\n";

/// The credential of the benchmark's first user; user `u > 0` carries it suffixed `-u`.
pub const CREDENTIAL: &str = "bench-credential";

/// The credential of benchmark user `user`.
pub fn credential(user: usize) -> String {
    if user == 0 {
        CREDENTIAL.to_owned()
    } else {
        format!("{CREDENTIAL}-{user}")
    }
}

/// Percentiles of one way of calling, in milliseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Timing {
    pub first_byte_p50_ms: f64,
    pub first_byte_p99_ms: f64,
    pub total_p50_ms: f64,
    pub total_p99_ms: f64,
    /// Calls answered a second over the pass (all streams together).
    pub calls_per_s: f64,
    /// The process's CPU time over the pass a call (the proxy's, the local upstream's and the
    /// client's, all in this process), in milliseconds.
    pub cpu_ms_per_call: f64,
    /// What the CPU allows: the cores this process may run on over [`Timing::cpu_ms_per_call`],
    /// calls a second. Idle worker threads that spin before they sleep count as busy, so the
    /// bound is if anything low.
    pub cpu_bound_calls_per_s: f64,
}

/// CPU time the process has used, all its threads together.
fn process_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// How each way of calling is driven: `requests` calls, `concurrency` at once, call `i`
/// carrying the credential of user `i mod users` ([`credential`]).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Calls {
    pub users: usize,
    pub concurrency: usize,
    pub requests: usize,
}

/// The three ways measured in one run.
#[derive(Debug, Clone, Serialize)]
pub struct ProxyReport {
    /// Rows the store holds, and those in the first user's scope.
    pub rows: usize,
    pub scope_rows: usize,
    #[serde(flatten)]
    pub calls: Calls,
    pub direct: Timing,
    pub proxy: Timing,
    pub proxy_recall_off: Timing,
    /// How long the upstream took to answer each request (0: at once).
    pub first_byte_upstream_ms: u64,
    /// `proxy − direct` at p99 of time to first byte, with memory and with recall off.
    pub added_first_byte_p99_ms: f64,
    pub added_first_byte_p99_recall_off_ms: f64,
}

/// Start the local upstream, answering each request `first_byte` after reading it; returns
/// its address.
pub async fn local_upstream(first_byte: Duration) -> std::io::Result<SocketAddr> {
    answering_upstream(STREAM, None, first_byte).await
}

/// Start a local upstream that answers every request with `stream` (an event stream),
/// `first_byte` after reading it, keeping each request's body in `record` when given; returns
/// its address.
pub async fn answering_upstream(
    stream: &'static str,
    record: Option<Arc<Mutex<Vec<Vec<u8>>>>>,
    first_byte: Duration,
) -> std::io::Result<SocketAddr> {
    upstream(
        move || Some(Bytes::from_static(stream.as_bytes())),
        record,
        first_byte,
    )
    .await
}

/// Start a local upstream that answers each request with the next stream of `script` (a
/// replayed session's recorded answers, queued one per request as the requests go out one at
/// a time), keeping each request's body in `record`; returns its address. A request that finds
/// the script empty is answered 500.
pub async fn scripted_upstream(
    script: Arc<Mutex<VecDeque<Bytes>>>,
    record: Arc<Mutex<Vec<Vec<u8>>>>,
) -> std::io::Result<SocketAddr> {
    upstream(
        move || script.lock().pop_front(),
        Some(record),
        Duration::ZERO,
    )
    .await
}

/// Start a local upstream that answers every request with the event stream `answer` gives
/// (500 when it gives none), `first_byte` after reading the request, keeping each request's
/// body in `record` when given; returns its address.
async fn upstream(
    answer: impl Fn() -> Option<Bytes> + Send + Sync + 'static,
    record: Option<Arc<Mutex<Vec<Vec<u8>>>>>,
    first_byte: Duration,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((connection, _)) = listener.accept().await {
            let _ = connection.set_nodelay(true);
            let (record, answer) = (record.clone(), Arc::clone(&answer));
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<Incoming>| {
                    let (record, answer) = (record.clone(), Arc::clone(&answer));
                    async move {
                        let body = req.into_body().collect().await;
                        if let (Some(record), Ok(body)) = (record, body) {
                            record.lock().push(body.to_bytes().to_vec());
                        }
                        if !first_byte.is_zero() {
                            // A thread's sleep, not the runtime's timer: that one rounds up to
                            // whole milliseconds, so a call arriving a little later could wait a
                            // millisecond more.
                            let _ = tokio::task::spawn_blocking(move || {
                                std::thread::sleep(first_byte);
                            })
                            .await;
                        }
                        let response = match answer() {
                            Some(stream) => Response::builder()
                                .header("content-type", "text/event-stream")
                                .body(Full::new(stream)),
                            None => Response::builder()
                                .status(500)
                                .header("content-type", "application/json")
                                .body(Full::new(Bytes::from_static(
                                    b"{\"error\":{\"type\":\"api_error\",\"message\":\"no answer scripted\"}}",
                                ))),
                        };
                        Ok::<_, Infallible>(response.expect("a valid response"))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(connection), service)
                    .await;
            });
        }
    });
    Ok(addr)
}

/// Measure `calls` against the upstream at `upstream` (answering `first_byte` after each
/// request) directly and through a proxy serving `state` (whose OpenAI upstream must be it,
/// its store holding `(rows, scope_rows)`), each call carrying one of `questions` in turn.
pub async fn measure(
    state: Arc<State>,
    (upstream, first_byte): (SocketAddr, Duration),
    (rows, scope_rows): (usize, usize),
    calls: Calls,
    questions: &[String],
) -> std::io::Result<ProxyReport> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let proxy = listener.local_addr()?;
    tokio::spawn(serve(listener, state));
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build(connector);
    let questions = Arc::new(questions.to_vec());
    let run = |target: SocketAddr, recall: bool, pass: &'static str| {
        let (client, questions) = (client.clone(), Arc::clone(&questions));
        async move { timing(&client, target, recall, calls, &questions, pass).await }
    };
    // Warm both paths (connections, caches) before measuring.
    run(upstream, true, "warm direct").await;
    run(proxy, true, "warm").await;
    let direct = run(upstream, true, "direct").await;
    let with_memory = run(proxy, true, "memory").await;
    let recall_off = run(proxy, false, "recall off").await;
    Ok(ProxyReport {
        rows,
        scope_rows,
        calls,
        first_byte_upstream_ms: first_byte.as_millis().try_into().unwrap_or(u64::MAX),
        added_first_byte_p99_ms: with_memory.first_byte_p99_ms - direct.first_byte_p99_ms,
        added_first_byte_p99_recall_off_ms: recall_off.first_byte_p99_ms - direct.first_byte_p99_ms,
        direct,
        proxy: with_memory,
        proxy_recall_off: recall_off,
    })
}

async fn timing(
    client: &Client<HttpConnector, Full<Bytes>>,
    target: SocketAddr,
    recall: bool,
    calls: Calls,
    questions: &[String],
    pass: &'static str,
) -> Timing {
    let Calls {
        users,
        concurrency,
        requests,
    } = calls;
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let cpu_before = process_cpu();
    let mut workers = Vec::with_capacity(concurrency);
    for _ in 0..concurrency.max(1) {
        let (client, next) = (client.clone(), Arc::clone(&next));
        let questions = questions.to_vec();
        workers.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= requests {
                    return samples;
                }
                let question = &questions[i % questions.len()];
                let credential = credential(i % users);
                let conversation = format!("bench {pass} {i}");
                samples.push(
                    one(
                        &client,
                        target,
                        recall,
                        (&credential, &conversation),
                        question,
                    )
                    .await,
                );
            }
        }));
    }
    let mut samples = Vec::with_capacity(requests);
    for worker in workers {
        samples.extend(worker.await.expect("a worker finishes"));
    }
    let elapsed = started.elapsed();
    let cpu_ms_per_call = (process_cpu() - cpu_before).as_secs_f64() * 1e3 / requests.max(1) as f64;
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let (mut first, mut total) = (latency::histogram(), latency::histogram());
    for (_, to_first, to_end) in samples {
        latency::record(&mut first, to_first);
        latency::record(&mut total, to_end);
    }
    let ms = latency::ms;
    Timing {
        first_byte_p50_ms: ms(&first, 0.5),
        first_byte_p99_ms: ms(&first, 0.99),
        total_p50_ms: ms(&total, 0.5),
        total_p99_ms: ms(&total, 0.99),
        calls_per_s: requests as f64 / elapsed.as_secs_f64(),
        cpu_ms_per_call,
        cpu_bound_calls_per_s: cores as f64 * 1e3 / cpu_ms_per_call.max(f64::MIN_POSITIVE),
    }
}

/// One streamed request: its status, time to the first body frame, and to the end of the
/// body. Each call is a new turn of a conversation of its own, so the proxy captures its
/// question (the same question again in the same conversation would be a client's retry, not
/// stored again).
pub(super) async fn one(
    client: &Client<HttpConnector, Full<Bytes>>,
    target: SocketAddr,
    recall: bool,
    (credential, conversation): (&str, &str),
    question: &str,
) -> (u16, Duration, Duration) {
    let body = serde_json::json!({
        "model": "gpt-4o",
        "stream": true,
        "messages": [{"role": "user", "content": question}],
    });
    let request = Request::post(format!("http://{target}/v1/chat/completions"))
        .header("authorization", format!("Bearer {credential}"))
        .header("content-type", "application/json")
        .header("x-perpetuity-recall", if recall { "on" } else { "off" })
        .header("x-perpetuity-conversation", conversation)
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a valid request");
    let started = Instant::now();
    let response = client.request(request).await.expect("the call is answered");
    let status = response.status().as_u16();
    let mut body = response.into_body();
    let mut first = None;
    while let Some(frame) = body.frame().await {
        frame.expect("the body reads");
        first.get_or_insert_with(|| started.elapsed());
    }
    let total = started.elapsed();
    (status, first.unwrap_or(total), total)
}

/// What `bench bodies` measured.
#[derive(Debug, Clone, Serialize)]
pub struct BodiesReport {
    pub concurrent: usize,
    /// Each body's size and its messages (tiny ones, the worst case for a parsed tree).
    pub body_bytes: usize,
    pub messages: usize,
    /// The proxy's answers, in order.
    pub statuses: Vec<u16>,
    /// The process's resident memory before the bodies were built, and its peak while they
    /// were sent and answered (the bodies themselves included, once each).
    pub resident_before_mib: f64,
    pub resident_peak_mib: f64,
    /// `(peak − before − the bodies) / concurrent`, and that against one body's size.
    pub per_body_mib: f64,
    pub per_body_ratio: f64,
    pub seconds: f64,
}

/// A field of `/proc/self/status` in MiB (`VmRSS`, `VmHWM`).
fn status_mib(field: &str) -> std::io::Result<f64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<f64>().ok())
        .ok_or_else(|| std::io::Error::other(format!("no {field} in /proc/self/status")))?;
    Ok(kib / 1024.0)
}

/// Send `concurrent` chat bodies of about `bytes` bytes each (tiny messages, then a question)
/// through a proxy serving `state` at once, and read the process's peak resident memory
/// (Linux: `VmHWM`, reset through `/proc/self/clear_refs` before the run).
pub async fn bodies(
    state: Arc<State>,
    concurrent: usize,
    bytes: usize,
) -> std::io::Result<BodiesReport> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let proxy = listener.local_addr()?;
    tokio::spawn(serve(listener, state));
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let resident_before = status_mib("VmRSS")?;
    let message = r#"{"role":"user","content":"a"},"#;
    let messages = bytes / message.len();
    let mut body = String::with_capacity(bytes + 256);
    body.push_str(r#"{"model":"gpt-4o","stream":true,"messages":["#);
    for _ in 0..messages {
        body.push_str(message);
    }
    body.push_str(r#"{"role":"user","content":"What did I say first?"}]}"#);
    let body = Bytes::from(body);
    std::fs::write("/proc/self/clear_refs", "5")?;
    let started = Instant::now();
    let calls = (0..concurrent).map(|i| {
        let (client, body) = (client.clone(), body.clone());
        async move {
            let request = Request::post(format!("http://{proxy}/v1/chat/completions"))
                .header("authorization", format!("Bearer {}", credential(i)))
                .header("content-type", "application/json")
                .body(Full::new(body))
                .expect("a valid request");
            let response = client
                .request(request)
                .await
                .map_err(std::io::Error::other)?;
            let status = response.status().as_u16();
            response
                .into_body()
                .collect()
                .await
                .map_err(std::io::Error::other)?;
            std::io::Result::Ok(status)
        }
    });
    let statuses = all_at_once(calls).await?;
    let seconds = started.elapsed().as_secs_f64();
    let resident_peak = status_mib("VmHWM")?;
    let body_mib = body.len() as f64 / f64::from(1 << 20);
    let per_body = (resident_peak - resident_before - body_mib) / concurrent as f64;
    Ok(BodiesReport {
        concurrent,
        body_bytes: body.len(),
        messages: messages + 1,
        statuses,
        resident_before_mib: resident_before,
        resident_peak_mib: resident_peak,
        per_body_mib: per_body,
        per_body_ratio: per_body / body_mib,
        seconds,
    })
}

/// Run `calls` at once on the runtime; their results in order.
async fn all_at_once<T: Send + 'static>(
    calls: impl Iterator<Item = impl Future<Output = std::io::Result<T>> + Send + 'static>,
) -> std::io::Result<Vec<T>> {
    let tasks: Vec<_> = calls.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(tasks.len());
    for task in tasks {
        out.push(task.await.map_err(std::io::Error::other)??);
    }
    Ok(out)
}
