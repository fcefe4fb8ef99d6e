//! A scripted upstream on loopback that speaks the providers' wire formats (replaying recorded
//! streams), and the proxy in front of it, for the proxy and SDK tests.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

use perpetuity::arena::Arena;
use perpetuity::engine::Engine;
use perpetuity::proxy::identity::Secret;
use perpetuity::proxy::{ProxyConfig, State, serve};
use perpetuity::scan::kernels::{Ceiling, Kernels};
use perpetuity::types::UserId;

/// One request the upstream received.
#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    pub headers: hyper::HeaderMap,
    pub body: Vec<u8>,
}

impl Received {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A non-streamed Chat Completions request asking `question`.
pub fn chat_request(question: &str) -> Vec<u8> {
    serde_json::json!({"model": "gpt-4o", "messages": [{"role": "user", "content": question}]})
        .to_string()
        .into_bytes()
}

/// A whole (non-streamed) Chat Completions reply saying `text`.
pub fn chat_reply(text: &str) -> Answer {
    Answer::Whole(
        200,
        "application/json",
        serde_json::json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]})
            .to_string()
            .into_bytes(),
    )
}

/// One scripted answer.
pub enum Answer {
    /// Status, content type, body sent whole.
    Whole(u16, &'static str, Vec<u8>),
    /// An event stream sent in two parts, the second only once the test says so.
    Held(Vec<u8>, Vec<u8>, oneshot::Receiver<()>),
}

/// Answers a request from its content, given how many requests came before it.
pub type Responder = Arc<dyn Fn(usize, &Received) -> Answer + Send + Sync>;

#[derive(Default)]
struct Script {
    answers: Mutex<VecDeque<Answer>>,
    received: Mutex<Vec<Received>>,
    responder: Mutex<Option<Responder>>,
}

type UpstreamBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

async fn upstream_answer(
    req: Request<Incoming>,
    script: Arc<Script>,
) -> Result<Response<UpstreamBody>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.unwrap().to_bytes().to_vec();
    let received = Received {
        path: parts.uri.path_and_query().unwrap().to_string(),
        headers: parts.headers,
        body,
    };
    let index = {
        let mut all = script.received.lock().unwrap();
        all.push(received.clone());
        all.len() - 1
    };
    let responder = script.responder.lock().unwrap().clone();
    let answer = match responder {
        Some(respond) => respond(index, &received),
        None => script
            .answers
            .lock()
            .unwrap()
            .pop_front()
            .expect("a scripted answer"),
    };
    Ok(match answer {
        Answer::Whole(status, content_type, body) => Response::builder()
            .status(status)
            .header("content-type", content_type)
            .body(Full::new(Bytes::from(body)).boxed())
            .unwrap(),
        Answer::Held(first, rest, go) => {
            let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
            tokio::spawn(async move {
                tx.send(Ok(Frame::data(Bytes::from(first)))).await.unwrap();
                let _ = go.await;
                let _ = tx.send(Ok(Frame::data(Bytes::from(rest)))).await;
            });
            Response::builder()
                .status(200)
                .header("content-type", "text/event-stream")
                .body(Held(rx).boxed())
                .unwrap()
        }
    })
}

/// A receiver of frames as a body.
struct Held(mpsc::Receiver<Result<Frame<Bytes>, Infallible>>);

impl hyper::body::Body for Held {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx)
    }
}

/// The scripted upstream, listening on loopback until its runtime ends.
pub struct Upstream {
    pub addr: SocketAddr,
    script: Arc<Script>,
}

impl Upstream {
    /// Listen on a free loopback port (inside a tokio runtime).
    pub async fn start() -> Self {
        let script = Arc::new(Script::default());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let served = Arc::clone(&script);
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let script = Arc::clone(&served);
                tokio::spawn(async move {
                    let service = service_fn(move |req| upstream_answer(req, Arc::clone(&script)));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, script }
    }

    /// `http://ADDR`, the base URL a proxy forwards to.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Queue the answer to the next request that has none yet.
    pub fn answer(&self, answer: Answer) {
        self.script.answers.lock().unwrap().push_back(answer);
    }

    /// Every request received so far, in arrival order.
    pub fn received(&self) -> Vec<Received> {
        self.script.received.lock().unwrap().clone()
    }

    /// Answer every later request with `responder` instead of the queued answers.
    pub fn respond_with(&self, responder: Responder) {
        *self.script.responder.lock().unwrap() = Some(responder);
    }
}

/// The proxy and its scripted upstream.
pub struct Harness {
    _dir: tempfile::TempDir,
    pub state: Arc<State>,
    pub proxy: SocketAddr,
    upstream: Upstream,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Harness {
    pub async fn start(configure: impl FnOnce(&mut ProxyConfig)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let memory = super::memory(dir.path());
        let scripted = Upstream::start().await;
        let upstream = scripted.url();
        let mut config = ProxyConfig {
            openai: upstream.clone(),
            anthropic: upstream.clone(),
            gemini: upstream,
            ..ProxyConfig::default()
        };
        configure(&mut config);
        let state = Arc::new(State::new(
            Engine::new(memory, Arena::new(), Kernels::detect(Ceiling::Native)),
            Secret::from_bytes([7; 32]),
            config,
        ));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, Arc::clone(&state)));
        Self {
            _dir: dir,
            state,
            proxy,
            upstream: scripted,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    pub fn answer(&self, answer: Answer) {
        self.upstream.answer(answer);
    }

    /// Take back the next scripted answer (one the proxy never asked for).
    pub fn script_pop(&self) {
        self.upstream.script.answers.lock().unwrap().pop_front();
    }

    pub fn received(&self) -> Vec<Received> {
        self.upstream.received()
    }

    /// Answer every later upstream request with `responder` instead of the queued answers.
    pub fn respond_with(&self, responder: Responder) {
        self.upstream.respond_with(responder);
    }

    pub async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Response<Incoming> {
        let mut builder = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.proxy));
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let request = builder
            .body(Full::new(Bytes::copy_from_slice(body)))
            .unwrap();
        self.client.request(request).await.unwrap()
    }

    /// Rows of the user behind `credential`, waiting up to 10 s for `expected` of them.
    pub fn rows_of(&self, credential: &str, expected: usize) -> Vec<perpetuity::store::Row> {
        let user = UserId::from_key(&self.state.secret.user_key(credential, None));
        let started = Instant::now();
        loop {
            let rows: Vec<_> = self
                .state
                .engine
                .generation()
                .memory
                .store
                .rows_of(user)
                .collect::<Result<_, _>>()
                .unwrap();
            if rows.len() >= expected || started.elapsed() > Duration::from_secs(10) {
                return rows;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A recording stored one `data:` payload per line, framed as a Responses or Anthropic stream:
/// `event: TYPE`, `data: LINE`, a blank line.
pub fn jsonl_as_sse(lines: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for line in String::from_utf8_lossy(lines)
        .lines()
        .filter(|l| !l.trim().is_empty())
    {
        let kind = serde_json::from_str::<Value>(line).unwrap()["type"]
            .as_str()
            .unwrap()
            .to_owned();
        out.extend_from_slice(format!("event: {kind}\ndata: {line}\n\n").as_bytes());
    }
    out
}

/// A Gemini recording stored one chunk per line, framed as its `alt=sse` stream: `data: LINE`
/// and a blank line, CRLF-terminated as Google sends them.
pub fn gemini_jsonl_as_sse(lines: &[u8]) -> Vec<u8> {
    String::from_utf8_lossy(lines)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .flat_map(|l| format!("data: {l}\r\n\r\n").into_bytes())
        .collect()
}

pub fn fixture(path: &str) -> Option<Vec<u8>> {
    let file: PathBuf = super::shared_dir()?.join("fixtures/providers").join(path);
    match std::fs::read(&file) {
        Ok(bytes) => Some(bytes),
        Err(_) => {
            eprintln!("SKIP: fixture {} is absent", file.display());
            None
        }
    }
}

pub async fn body_of(response: Response<Incoming>) -> Vec<u8> {
    response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec()
}

pub fn header<'a>(response: &'a Response<Incoming>, name: &str) -> &'a str {
    response
        .headers()
        .get(name)
        .map_or("", |v| v.to_str().unwrap())
}

/// A bare upstream on loopback below HTTP, for the tests of what a broken or hostile one does:
/// for every connection it reads the request (one read), then hands the socket to `answer` on
/// a thread of its own. Returns its URL.
pub fn raw_upstream(answer: impl Fn(std::net::TcpStream) + Copy + Send + 'static) -> String {
    use std::io::Read as _;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                let _ = stream.read(&mut buf);
                answer(stream);
            });
        }
    });
    url
}

/// A [`raw_upstream`] that writes `head`, then `chunk` again and again until `total` bytes or
/// until the socket refuses more.
pub fn endless_upstream(head: &'static [u8], chunk: &'static [u8], total: usize) -> String {
    raw_upstream(move |mut stream| {
        use std::io::Write as _;
        let _ = stream.write_all(head);
        let mut sent = 0;
        while sent < total && stream.write_all(chunk).is_ok() {
            sent += chunk.len();
        }
    })
}
