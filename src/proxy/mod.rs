//! The HTTP front: a drop-in base URL for OpenAI Chat Completions and Anthropic Messages.
//!
//! Per chat request: identify the user (a keyed hash of the credential) and the conversation,
//! capture the new user turn, catch the arena up, recall (retrieve, reheat, budget, frame),
//! replace the harness's messages with the frame, forward to the provider, stream the reply back
//! as it arrives, and capture the reply when the stream ends. Every other route is passed
//! through to the provider the credential names, untouched. `docs/proxy.md` has the switches and
//! headers; `docs/security.md` the trust model.

pub mod identity;
pub mod provider;
pub mod wire;

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::arena::Arena;
use crate::capture::{Capturer, Message};
use crate::error::Error;
use crate::memory::Memory;
use crate::recall::{Ask, Recall, RecallConfig, recall};
use crate::scan::kernels::Kernels;
use crate::types::{Role, UserId};

use identity::{CONVERSATION_HEADER, Secret, USER_HEADER};
use provider::{Failure, Provider};

/// A response body: whole, or streamed from a channel as upstream bytes arrive.
pub type Body = BoxBody<Bytes, Infallible>;

/// Where each provider's API lives, and the limits of one request.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    pub openai: String,
    pub anthropic: String,
    pub gemini: String,
    /// Largest request body accepted (and largest non-streamed reply read), in bytes.
    pub body_limit: usize,
    /// How long the upstream may take to send its response headers.
    pub upstream_timeout: Duration,
    pub recall: RecallConfig,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            openai: "https://api.openai.com".into(),
            anthropic: "https://api.anthropic.com".into(),
            gemini: "https://generativelanguage.googleapis.com".into(),
            body_limit: 32 * 1024 * 1024,
            upstream_timeout: Duration::from_secs(300),
            recall: RecallConfig::default(),
        }
    }
}

impl ProxyConfig {
    /// The base URL of `provider`'s API.
    pub fn upstream(&self, provider: Provider) -> &str {
        match provider {
            Provider::OpenAi => &self.openai,
            Provider::Anthropic => &self.anthropic,
            Provider::Gemini => &self.gemini,
        }
    }

    /// Set `provider`'s base URL.
    pub fn set_upstream(&mut self, provider: Provider, url: String) {
        match provider {
            Provider::OpenAi => self.openai = url,
            Provider::Anthropic => self.anthropic = url,
            Provider::Gemini => self.gemini = url,
        }
    }
}

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// What every connection shares.
pub struct State {
    pub memory: Memory,
    /// The arena the scan reads, caught up before every recall.
    pub arena: RwLock<Arena>,
    pub kernels: Kernels,
    pub secret: Secret,
    pub config: ProxyConfig,
    client: HttpsClient,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("memory", &self.memory)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl State {
    pub fn new(
        memory: Memory,
        arena: Arena,
        kernels: Kernels,
        secret: Secret,
        config: ProxyConfig,
    ) -> Self {
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .build();
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(20))
            .build(https);
        Self {
            memory,
            arena: RwLock::new(arena),
            kernels,
            secret,
            config,
            client,
        }
    }
}

/// Accept connections on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, state: Arc<State>) -> std::io::Result<()> {
    loop {
        let (stream, peer) = listener.accept().await?;
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let service = service_fn(move |req| route(req, Arc::clone(&state)));
            if let Err(err) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%peer, %err, "connection ended with an error");
            }
        });
    }
}

async fn route(req: Request<Incoming>, state: Arc<State>) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_owned();
    Ok(match (req.method(), path.as_str()) {
        (&Method::GET, "/healthz") => json(
            StatusCode::OK,
            &serde_json::json!({
                "status": "ok",
                "dictionary": state.memory.dictionary.version(),
                "next_row": state.memory.store.next_row().0,
            }),
        ),
        (&Method::POST, "/v1/chat/completions") => chat(req, state, Provider::OpenAi).await,
        (&Method::POST, "/v1/messages") => chat(req, state, Provider::Anthropic).await,
        _ => pass_through(req, state).await,
    })
}

/// The per-request switches (headers; `docs/proxy.md`).
#[derive(Debug, Clone, Copy)]
struct Switches {
    capture: bool,
    recall: bool,
    probe: bool,
}

impl Switches {
    fn from(headers: &HeaderMap) -> Self {
        let switch = |name: &str, default: bool| match headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim().to_ascii_lowercase())
            .as_deref()
        {
            Some("off" | "false" | "0" | "no") => false,
            Some("on" | "true" | "1" | "yes") => true,
            _ => default,
        };
        Self {
            capture: switch("x-perpetuity-capture", true),
            recall: switch("x-perpetuity-recall", true),
            probe: switch("x-perpetuity-probe", false),
        }
    }

    /// Whether anything of this request is written (capture, reheat, the reply).
    fn writes(self) -> bool {
        self.capture && !self.probe
    }
}

/// Who is asking, in which conversation.
#[derive(Debug, Clone)]
struct Identity {
    user_key: String,
    conversation: String,
}

/// A chat request through the pipeline.
async fn chat(req: Request<Incoming>, state: Arc<State>, provider: Provider) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let Some(credential) = provider.credential(&parts.headers) else {
        return failure(
            provider,
            Failure::Authentication,
            "no API key: send the provider's credential header (Authorization: Bearer, or x-api-key for Anthropic)",
        );
    };
    if provider == Provider::Anthropic && !parts.headers.contains_key("anthropic-version") {
        return failure(
            provider,
            Failure::InvalidRequest,
            "the anthropic-version header is required",
        );
    }
    let bytes = match read_body(body, state.config.body_limit).await {
        Ok(bytes) => bytes,
        Err(failed) => return failure(provider, failed.0, &failed.1),
    };
    let request = match wire::parse(provider, &bytes) {
        Ok(request) => request,
        Err(reason) => return failure(provider, Failure::InvalidRequest, &reason),
    };
    let switches = Switches::from(&parts.headers);
    let narrow = parts.headers.get(USER_HEADER).and_then(|v| v.to_str().ok());
    let identity = Identity {
        user_key: state.secret.user_key(&credential, narrow),
        conversation: parts
            .headers
            .get(CONVERSATION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .unwrap_or_else(|| identity::conversation_key(request.first.as_deref().unwrap_or(""))),
    };

    let remembered = {
        let (state, request, identity) = (Arc::clone(&state), request.clone(), identity.clone());
        tokio::task::spawn_blocking(move || remember(&state, &request, &identity, switches)).await
    };
    let (outbound, memory_status, recall) = match remembered {
        Ok(Ok(Some(recall))) => (
            wire::with_frame(provider, &request, &recall.frame),
            "ok",
            Some(recall),
        ),
        Ok(Ok(None)) => (bytes.to_vec(), "off", None),
        Ok(Err(err)) => {
            tracing::error!(%err, "memory unavailable; forwarding the request untouched");
            (bytes.to_vec(), "unavailable", None)
        }
        Err(err) => {
            tracing::error!(%err, "memory task failed; forwarding the request untouched");
            (bytes.to_vec(), "unavailable", None)
        }
    };

    let upstream = match forward(&state, provider, &parts, outbound).await {
        Ok(upstream) => upstream,
        Err((failed, message)) => return failure(provider, failed, &message),
    };
    let mut report = HeaderMap::new();
    report.insert(
        "x-perpetuity-memory",
        HeaderValue::from_static(memory_status),
    );
    if let Ok(version) = HeaderValue::from_str(state.memory.dictionary.version()) {
        report.insert("x-perpetuity-dictionary", version);
    }
    if let Some(recall) = &recall {
        for (name, value) in [
            ("x-perpetuity-retrieved", recall.retrieved.len()),
            ("x-perpetuity-frame-tokens", recall.frame.tokens),
            ("x-perpetuity-trimmed", recall.frame.omitted.turns),
        ] {
            report.insert(name, HeaderValue::from(value));
        }
    }
    let reply = (memory_status != "unavailable" && switches.writes()).then(|| Reply {
        state: Arc::clone(&state),
        provider,
        identity,
        model: request.model.clone(),
    });
    respond(upstream, report, provider, reply, state.config.body_limit).await
}

/// Capture the new user turn and recall for the live question, as the switches allow.
/// `Ok(None)` when recall is off or there is no question to recall for.
fn remember(
    state: &State,
    request: &wire::Request,
    identity: &Identity,
    switches: Switches,
) -> Result<Option<Recall>, Error> {
    let memory = &state.memory;
    let mut stored = false;
    if switches.writes() && request.question_is_new() {
        let text = request.question.clone().unwrap_or_default();
        let ids = Capturer::new(&memory.dictionary).capture(
            &memory.store,
            &[Message {
                user_key: identity.user_key.clone(),
                conversation: identity.conversation.clone(),
                role: Role::User,
                name: None,
                timestamp_ms: Some(now_ms()),
                source_turn: None,
                text,
            }],
        )?;
        stored = ids.first().is_some_and(|ids| !ids.is_empty());
    }
    let (true, Some(question)) = (switches.recall, request.question.as_deref()) else {
        return Ok(None);
    };
    state
        .arena
        .write()
        .expect("arena lock")
        .catch_up(&memory.store, &memory.dictionary)?;
    let arena = state.arena.read().expect("arena lock");
    let ask = Ask {
        user: UserId::from_key(&identity.user_key),
        conversation: Some(&identity.conversation),
        question,
        probe: !stored || !switches.writes(),
        now_ms: Some(now_ms()),
    };
    Ok(Some(recall(
        memory,
        &arena,
        &state.kernels,
        &state.config.recall,
        &ask,
    )?))
}

/// Where a finished reply is captured.
struct Reply {
    state: Arc<State>,
    provider: Provider,
    identity: Identity,
    model: String,
}

impl Reply {
    /// Store the reply's text as the assistant's turn (marked when the stream was cut short).
    fn capture(self, text: String, complete: bool) {
        if text.is_empty() {
            return;
        }
        let text = if complete {
            text
        } else {
            format!("{text}\n[reply truncated: the stream ended before the provider finished]")
        };
        let memory = &self.state.memory;
        let result = Capturer::new(&memory.dictionary).capture(
            &memory.store,
            &[Message {
                user_key: self.identity.user_key,
                conversation: self.identity.conversation,
                role: Role::Assistant,
                name: Some(self.model),
                timestamp_ms: Some(now_ms()),
                source_turn: None,
                text,
            }],
        );
        if let Err(err) = result {
            tracing::error!(%err, provider = self.provider.name(), "capturing the reply failed");
        }
    }
}

/// The upstream's answer, passed to the client: streamed event by event (and read for its text
/// on the way), or read whole. Headers from the pipeline are added.
async fn respond(
    upstream: Response<Incoming>,
    report: HeaderMap,
    provider: Provider,
    reply: Option<Reply>,
    limit: usize,
) -> Response<Body> {
    let (mut parts, body) = upstream.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.extend(report);
    let streaming = parts
        .headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let success = parts.status.is_success();
    if streaming {
        parts
            .headers
            .insert("x-accel-buffering", HeaderValue::from_static("no"));
        parts.headers.insert(
            hyper::header::CACHE_CONTROL,
            HeaderValue::from_static("no-cache"),
        );
        let (tx, rx) = mpsc::channel::<Bytes>(64);
        tokio::spawn(relay(body, tx, provider, reply.filter(|_| success)));
        return Response::from_parts(parts, Channel(rx).boxed());
    }
    match read_body(body, limit).await {
        Ok(bytes) => {
            if let (Some(reply), true) = (reply, success)
                && let Some(text) = wire::reply_text(provider, &bytes)
            {
                let _ = tokio::task::spawn_blocking(move || reply.capture(text, true)).await;
            }
            Response::from_parts(parts, Full::new(bytes).boxed())
        }
        Err((_, message)) => failure(provider, Failure::Upstream, &message),
    }
}

/// Forward upstream frames to the client as they arrive, reading the reply's text; end the last
/// event with a blank line if the upstream did not; capture the reply at the end. A client that
/// goes away stops the relay, which drops (cancels) the upstream request; what was received is
/// captured, marked truncated.
async fn relay(
    mut body: Incoming,
    tx: mpsc::Sender<Bytes>,
    provider: Provider,
    reply: Option<Reply>,
) {
    let mut reader = wire::StreamReader::new(provider);
    let mut client_gone = false;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            break;
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        reader.feed(&data);
        if tx.send(data).await.is_err() {
            client_gone = true;
            break;
        }
    }
    drop(body);
    if !client_gone && !reader.terminated() {
        let _ = tx.send(Bytes::from_static(b"\n\n")).await;
    }
    drop(tx);
    let (text, complete) = reader.finish();
    if let Some(reply) = reply {
        let complete = complete && !client_gone;
        let _ = tokio::task::spawn_blocking(move || reply.capture(text, complete)).await;
    }
}

/// Any other route: forwarded untouched to the provider the credential names (Gemini also by
/// its path), and its answer streamed back.
async fn pass_through(req: Request<Incoming>, state: Arc<State>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let provider = if parts.uri.path().starts_with("/v1beta/") {
        Some(Provider::Gemini)
    } else {
        Provider::from_headers(&parts.headers)
    };
    let Some(provider) = provider else {
        return failure(
            Provider::OpenAi,
            Failure::InvalidRequest,
            &format!(
                "cannot tell which provider {} {} is for: send the provider's credential header",
                parts.method,
                parts.uri.path()
            ),
        );
    };
    let bytes = match read_body(body, state.config.body_limit).await {
        Ok(bytes) => bytes,
        Err(failed) => return failure(provider, failed.0, &failed.1),
    };
    match forward(&state, provider, &parts, bytes.to_vec()).await {
        Ok(upstream) => {
            respond(
                upstream,
                HeaderMap::new(),
                provider,
                None,
                state.config.body_limit,
            )
            .await
        }
        Err((failed, message)) => failure(provider, failed, &message),
    }
}

/// Send the request to `provider`'s upstream with `body`: same method, path, query and headers
/// (minus hop-by-hop ones and our own), identity encoding so the stream can be read.
async fn forward(
    state: &State,
    provider: Provider,
    parts: &hyper::http::request::Parts,
    body: Vec<u8>,
) -> Result<Response<Incoming>, (Failure, String)> {
    let base = state.config.upstream(provider).trim_end_matches('/');
    let target = parts
        .uri
        .path_and_query()
        .map_or(parts.uri.path(), |pq| pq.as_str());
    let uri: hyper::Uri = format!("{base}{target}").parse().map_err(|e| {
        (
            Failure::Upstream,
            format!(
                "the {} upstream URL {base:?} is not valid: {e}",
                provider.name()
            ),
        )
    })?;
    let mut request = Request::builder()
        .method(parts.method.clone())
        .uri(uri)
        .body(Full::new(Bytes::from(body)))
        .expect("method and URI are valid");
    let headers = request.headers_mut();
    for (name, value) in &parts.headers {
        if !is_hop_by_hop(name)
            && name != hyper::header::HOST
            && name != hyper::header::CONTENT_LENGTH
            && name != hyper::header::ACCEPT_ENCODING
            && !name.as_str().starts_with("x-perpetuity-")
        {
            headers.append(name.clone(), value.clone());
        }
    }
    headers.insert(
        hyper::header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    match tokio::time::timeout(state.config.upstream_timeout, state.client.request(request)).await {
        Ok(Ok(response)) => Ok(response),
        Ok(Err(err)) => Err((
            Failure::Upstream,
            format!(
                "the {} upstream could not be reached: {err}",
                provider.name()
            ),
        )),
        Err(_) => Err((
            Failure::Timeout,
            format!(
                "the {} upstream sent no response within {:?}",
                provider.name(),
                state.config.upstream_timeout
            ),
        )),
    }
}

/// Read a whole body, refusing more than `limit` bytes.
async fn read_body<B>(body: B, limit: usize) -> Result<Bytes, (Failure, String)>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(err) if err.is::<http_body_util::LengthLimitError>() => Err((
            Failure::TooLarge,
            format!("the body is larger than the limit of {limit} bytes"),
        )),
        Err(err) => Err((
            Failure::InvalidRequest,
            format!("the body could not be read: {err}"),
        )),
    }
}

fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "upgrade"
    )
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let names: Vec<HeaderName> = headers
        .keys()
        .filter(|n| is_hop_by_hop(n) || *n == hyper::header::CONTENT_LENGTH)
        .cloned()
        .collect();
    for name in names {
        headers.remove(name);
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// An error the proxy answers itself, in `provider`'s shape.
fn failure(provider: Provider, failed: Failure, message: &str) -> Response<Body> {
    json(failed.status(), &provider.error_body(failed, message))
}

fn json(status: StatusCode, body: &serde_json::Value) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// A streamed body fed by the relay task.
struct Channel(mpsc::Receiver<Bytes>);

impl hyper::body::Body for Channel {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|next| next.map(|data| Ok(Frame::data(data))))
    }
}
