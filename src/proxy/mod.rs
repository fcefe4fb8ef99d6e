//! The HTTP front: a drop-in base URL for OpenAI Chat Completions and Responses, Anthropic
//! Messages and Gemini `generateContent`.
//!
//! Per chat request: identify the user (a keyed hash of the credential) and the conversation,
//! capture the new user turn, catch the arena up, recall (retrieve, reheat, budget, frame),
//! replace the harness's messages with the frame, forward to the provider, stream the reply back
//! as it arrives, and capture the reply when the stream ends. Every other route is passed
//! through to the provider the credential names, untouched. `docs/proxy.md` has the switches and
//! headers; `docs/security.md` the trust model.

pub mod admin;
mod deadline;
mod format;
pub mod harness;
pub mod health;
pub mod held;
pub mod hostile;
pub mod identity;
pub mod inspector;
pub mod load;
pub mod metrics;
pub mod prefix;
pub mod provider;
pub mod recent;
pub mod rounds;
pub mod sse;
pub mod turns;
pub mod verdict;
pub mod wire;

mod chat;
mod exclusions;
mod remember;
mod reply;
mod upstream;

use parking_lot::Mutex;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

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

use crate::config::{AdminToken, FileConfig, InspectorAccess};
use crate::engine::{Author, Engine, Exclusions, Generation};
use crate::error::Error;
use crate::recall::{Ask, Recall, RecallConfig};
use crate::store::{MAX_CHUNKS, StoreError};
use crate::types::{Role, RowId, UserId, now_ms};

use deadline::Deadline;
use identity::{CONVERSATION_HEADER, Groups, Secret, USER_HEADER};
use provider::{Failure, Provider};
use turns::{TurnFrame, TurnKey, Turns};

use chat::*;
pub use exclusions::EXCLUSIONS_PATH;
use exclusions::*;
use remember::*;
use reply::*;
use upstream::*;

/// Marks an error the proxy answered itself: `refused` (the request) or `upstream`.
pub const PROXY_ERROR: &str = "x-perpetuity-error";

/// Names what the request stored before its answer left (`question`, `reply`): an answer
/// acknowledges exactly what this header lists.
pub const CAPTURED: &str = "x-perpetuity-captured";

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
    /// How long a reply may stay silent (streamed, or read whole) before it is given up.
    pub stream_idle_timeout: Duration,
    /// How long connecting to the upstream may take.
    pub connect_timeout: Duration,
    /// How long a client may take to send a request's headers (also the keep-alive idle time,
    /// and the longest silence inside a request body).
    pub header_timeout: Duration,
    /// How long a client may take to send a whole request body: read before the request takes
    /// one of the [`ProxyConfig::max_concurrent`] slots, so a body that trickles holds none.
    pub body_timeout: Duration,
    /// Requests to the providers (chat and passed through) served at once; more are refused
    /// with 503 in the provider's shape.
    pub max_concurrent: usize,
    /// The token the admin endpoints require; without one they are disabled.
    pub admin_token: Option<AdminToken>,
    pub recall: RecallConfig,
    /// Whether the memory tools ride along with chat requests (a request's
    /// `x-perpetuity-tools: off` turns them off for it).
    pub tools: bool,
    /// Upstream calls per reply when the model calls the memory tools; the last one has no tools.
    pub tool_rounds: usize,
    /// Group scopes: whose memories a request's search reads besides the asker's own.
    pub groups: Groups,
    /// What the inspector's log of recent requests holds.
    pub recent: recent::Limits,
    /// Who may use the inspector.
    pub inspector: InspectorAccess,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            openai: "https://api.openai.com".into(),
            anthropic: "https://api.anthropic.com".into(),
            gemini: "https://generativelanguage.googleapis.com".into(),
            body_limit: 32 * 1024 * 1024,
            upstream_timeout: Duration::from_secs(300),
            stream_idle_timeout: Duration::from_secs(300),
            connect_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(60),
            max_concurrent: 256,
            admin_token: None,
            recall: RecallConfig::default(),
            tools: true,
            tool_rounds: rounds::DEFAULT_ROUNDS,
            groups: Groups::default(),
            recent: recent::Limits::default(),
            inspector: InspectorAccess::default(),
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

    /// The built-in defaults with a config file's `[upstreams]`, `[limits]`, `[recall]`,
    /// `[groups]` and `[inspector]` laid over them (the command line's upstreams are set after,
    /// provider by provider).
    pub fn from_file(file: &FileConfig) -> Result<Self, String> {
        let mut config = Self::default();
        for (provider, url) in [
            (Provider::OpenAi, &file.upstreams.openai),
            (Provider::Anthropic, &file.upstreams.anthropic),
            (Provider::Gemini, &file.upstreams.gemini),
        ] {
            if let Some(url) = url {
                config.set_upstream(provider, url.clone());
            }
        }
        let limits = &file.limits;
        let seconds = std::time::Duration::from_secs;
        set(&mut config.body_limit, limits.body_limit_bytes);
        set(
            &mut config.upstream_timeout,
            limits.upstream_timeout_s.map(seconds),
        );
        set(
            &mut config.stream_idle_timeout,
            limits.stream_idle_timeout_s.map(seconds),
        );
        set(
            &mut config.connect_timeout,
            limits.connect_timeout_s.map(seconds),
        );
        set(
            &mut config.header_timeout,
            limits.header_timeout_s.map(seconds),
        );
        set(&mut config.body_timeout, limits.body_timeout_s.map(seconds));
        if !file.groups.is_empty() {
            config.groups = Groups::new(file.groups.clone()).map_err(|e| format!("groups: {e}"))?;
        }
        let recall = &file.recall;
        set(&mut config.recall.budget.floor, recall.budget_floor_tokens);
        set(
            &mut config.recall.budget.ceiling,
            recall.budget_ceiling_tokens,
        );
        set(&mut config.recall.depth, recall.depth);
        set(&mut config.recall.reach, recall.reach);
        set(
            &mut config.recall.conversation_lift,
            recall.conversation_lift,
        );
        set(&mut config.recall.speaker_lift, recall.speaker_lift);
        set(&mut config.recall.model_weight, recall.model_weight);
        set(&mut config.recall.mandatory_hits, recall.mandatory_hits);
        set(&mut config.recall.recent_tokens, recall.recent_tokens);
        set(&mut config.recall.session_tokens, recall.session_tokens);
        set(&mut config.recall.session_share, recall.session_share);
        set(&mut config.recall.warm_floor, recall.warm_floor);
        set(&mut config.recent.per_user, file.inspector.recent_requests);
        set(&mut config.recent.bytes, file.inspector.recent_bytes);
        set(&mut config.inspector, file.inspector.access);
        let budget = config.recall.budget;
        if budget.floor > budget.ceiling {
            return Err(format!(
                "the recall budget's floor ({} tokens) is above its ceiling ({} tokens)",
                budget.floor, budget.ceiling
            ));
        }
        Ok(config)
    }
}

/// Take `value` for `target` where the file sets it.
fn set<T>(target: &mut T, value: Option<T>) {
    if let Some(value) = value {
        *target = value;
    }
}

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// What every connection shares.
pub struct State {
    /// The serving memory and every operation on it.
    pub engine: Engine,
    pub secret: Secret,
    pub config: ProxyConfig,
    pub metrics: metrics::Metrics,
    /// Whether the memory takes writes (`/healthz`).
    pub health: health::Health,
    /// Chat requests in flight, streams until their last byte.
    permits: Arc<tokio::sync::Semaphore>,
    /// Inspector and exclusions requests at work on the memory ([`SIDE_CONCURRENT`]).
    side: Arc<tokio::sync::Semaphore>,
    client: HttpsClient,
    /// Responses replies a memory round continued, for their `previous_response_id`.
    continued: rounds::Continued,
    /// The frames of recent turns, reused by their tool-round continuations.
    turns: Turns,
    /// The questions each conversation holds: what of a request's history the frame replaces.
    held: held::Held,
    /// The provider's verdict on each credential: who may be captured before forwarding.
    verdicts: verdict::Verdicts,
    /// The inspector's log of each user's last requests.
    recent: recent::Recent,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("engine", &self.engine)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl State {
    pub fn new(engine: Engine, secret: Secret, config: ProxyConfig) -> Self {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(config.connect_timeout));
        http.set_nodelay(true);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(20))
            .build(https);
        let recent = recent::Recent::new(config.recent);
        Self {
            engine,
            secret,
            permits: Arc::new(tokio::sync::Semaphore::new(config.max_concurrent)),
            side: Arc::new(tokio::sync::Semaphore::new(SIDE_CONCURRENT)),
            config,
            metrics: metrics::Metrics::default(),
            health: health::Health::default(),
            client,
            continued: rounds::Continued::default(),
            turns: Turns::default(),
            held: held::Held::default(),
            verdicts: verdict::Verdicts::default(),
            recent,
        }
    }
}

impl State {
    /// Chat requests holding one of the [`ProxyConfig::max_concurrent`] slots now.
    pub fn requests_in_flight(&self) -> usize {
        self.config.max_concurrent - self.permits.available_permits()
    }

    /// Whether the provider vouched for `credential` ([`verdict`]): only then may it see or
    /// change its memory through the inspector and the exclusions endpoint.
    fn vouched(&self, credential: &str) -> bool {
        self.verdicts
            .holds(UserId::from_key(&self.secret.user_key(credential, None)))
    }

    /// One of the [`SIDE_CONCURRENT`] slots of inspector and exclusions work, taken once the
    /// request's body has arrived; `None` when every one is taken.
    fn side_slot(self: &Arc<Self>) -> Option<tokio::sync::OwnedSemaphorePermit> {
        Arc::clone(&self.side).try_acquire_owned().ok()
    }
}

/// Inspector and exclusions requests at work on the memory at once, apart from the chat
/// requests' [`ProxyConfig::max_concurrent`]: more are refused with 503, so neither kind of
/// work can take the other's threads.
pub const SIDE_CONCURRENT: usize = 8;

/// What a credential the provider has not vouched for is told by the inspector and the
/// exclusions endpoint ([`State::vouched`]).
pub const UNVOUCHED: &str = "this credential's memory opens once the provider has accepted one of its requests through this proxy (within the last 24 hours, and not refused it since)";

/// What a request is told when every inspector and exclusions slot is taken.
pub const SIDE_BUSY: &str =
    "the memory's inspector and exclusions are busy with other requests: try again shortly";

/// What a request is told when the memory failed to answer it: the cause goes to the server's
/// log, never to the client (it may name the server's paths).
pub const MEMORY_FAILED: &str =
    "the memory could not answer this request; the server's log says why";

/// The largest body an inspector or exclusions request may send: a question, a search or
/// [`MAX_EXCLUSION_ROWS`] row ids need far less than a chat request's limit.
pub const SIDE_BODY_LIMIT: usize = 1024 * 1024;

/// Accept connections on `listener` until the task is dropped, probing the storage while it
/// fails ([`health::watch`]). A dark dictionary version installed and not yet derived (the
/// server stopped midway) is resumed first, in the background.
pub async fn serve(listener: TcpListener, state: Arc<State>) -> Infallible {
    if state
        .engine
        .generation()
        .memory
        .store
        .dark_dictionary()
        .is_some()
    {
        admin::start_rederive(&state);
    }
    tokio::select! {
        never = accept(listener, Arc::clone(&state)) => never,
        never = health::watch(state) => match never {},
    }
}

/// The first and the longest wait before accepting again after a failed accept.
const ACCEPT_BACKOFF: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(1));

/// Descriptors kept for the store besides its table files ([`crate::store::table_file_budget`]):
/// its write-ahead log, manifest, lock and info log, the files a flush or compaction writes,
/// and the arena's.
const STORE_RESERVE: u64 = 64;

/// How often a server whose connection slots stay taken says so.
const FULL_SAID_EVERY: Duration = Duration::from_secs(10);

/// The fewest connections served at once, however low the descriptor limit.
const MIN_CONNECTIONS: usize = 16;

/// How many connections to serve at once under the soft descriptor limit `soft`, with
/// `in_use` descriptors already open: each connection holds its own and at most one to the
/// upstream, and the store keeps its table files and [`STORE_RESERVE`], so a crowd of
/// connections can never leave a flush without a descriptor.
pub fn connection_cap(soft: Option<u64>, in_use: u64) -> usize {
    let most = tokio::sync::Semaphore::MAX_PERMITS;
    let Some(soft) = soft else {
        return most;
    };
    let store = crate::store::table_file_budget() as u64 + STORE_RESERVE;
    let free = soft.saturating_sub(in_use + store);
    usize::try_from(free / 2)
        .unwrap_or(most)
        .clamp(MIN_CONNECTIONS, most)
}

/// Descriptors this process has open now (Linux's `/proc/self/fd`; 0 where it cannot tell).
fn descriptors_in_use() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |entries| entries.count() as u64)
}

/// Serve every connection the listener takes, at most [`connection_cap`] at once: beyond it
/// new ones wait in the kernel's listen queue until a connection ends. A failed accept (the
/// process out of descriptors all the same, a connection reset before it was taken) leaves
/// the listener usable: it is logged and retried after a wait that doubles while accepts keep
/// failing, so the connections being served can finish and give their descriptors back.
async fn accept(listener: TcpListener, state: Arc<State>) -> Infallible {
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    let cap = connection_cap(soft, descriptors_in_use());
    tracing::info!(
        connections = cap,
        descriptors = ?soft,
        "connections served at once"
    );
    let slots = Arc::new(tokio::sync::Semaphore::new(cap));
    let mut backoff = ACCEPT_BACKOFF.0;
    let mut said: Option<std::time::Instant> = None;
    loop {
        let slot = match Arc::clone(&slots).try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                if said.is_none_or(|at| at.elapsed() >= FULL_SAID_EVERY) {
                    said = Some(std::time::Instant::now());
                    tracing::warn!(
                        connections = cap,
                        "every connection slot is taken: new connections wait until one ends"
                    );
                }
                Arc::clone(&slots)
                    .acquire_owned()
                    .await
                    .expect("the connection slots are never closed")
            }
        };
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => {
                backoff = ACCEPT_BACKOFF.0;
                accepted
            }
            Err(err) => {
                tracing::warn!(%err, ?backoff, "accepting a connection failed; accepting again after a wait");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(ACCEPT_BACKOFF.1);
                continue;
            }
        };
        // Events are small writes that must leave at once, not wait for an ACK (Nagle).
        if let Err(err) = stream.set_nodelay(true) {
            tracing::debug!(%peer, %err, "could not set TCP_NODELAY");
        }
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let _slot = slot;
            let header_timeout = state.config.header_timeout;
            let stream = Deadline::new(stream, state.config.stream_idle_timeout);
            let service = service_fn(move |req| route(req, Arc::clone(&state)));
            if let Err(err) = http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%peer, %err, "connection ended with an error");
            }
        });
    }
}

/// Raise the process's soft limit on open descriptors to its hard limit (each connection
/// holds one, and one more to the upstream); returns the soft limit now in force.
pub fn raise_descriptor_limit() -> Option<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => limit = raised,
            Err(err) => tracing::warn!(%err, "could not raise the open-descriptor limit"),
        }
    }
    limit.current
}

async fn route(req: Request<Incoming>, state: Arc<State>) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_owned();
    if path.starts_with("/admin/") {
        return Ok(admin::route(req, state).await);
    }
    if path.starts_with(inspector::PREFIX) && path != EXCLUSIONS_PATH {
        return Ok(inspector::route(req, state).await);
    }
    if req.method() == Method::POST
        && let Some(format) = wire::Format::at(&path)
    {
        return Ok(piped(req, state, format).await);
    }
    Ok(match (req.method(), path.as_str()) {
        (&Method::GET, "/healthz") => healthz(&state),
        (&Method::GET | &Method::POST, EXCLUSIONS_PATH) => {
            exclusions(req, state).await.unwrap_or_else(Response::from)
        }
        (&Method::GET, "/metrics") => {
            let mut response =
                Response::new(Full::new(Bytes::from(metrics::render_metrics(&state))).boxed());
            response.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            response
        }
        _ => {
            state
                .metrics
                .count(metrics::Event::Request(metrics::Route::PassThrough));
            let answered = pass_through(req, Arc::clone(&state)).await;
            counted(&state, answered.unwrap_or_else(Response::from))
        }
    })
}

/// `GET /healthz`: 200 while the memory takes writes, 503 with the reason while it does not
/// (a load balancer stops routing here; requests that still come are passed through).
fn healthz(state: &State) -> Response<Body> {
    let generation = state.engine.generation();
    let (dictionary, next_row) = (
        generation.memory.dictionary.version(),
        generation.memory.store.next_row().0,
    );
    match state.health.outage() {
        None => json(
            StatusCode::OK,
            &serde_json::json!({"status": "ok", "dictionary": dictionary, "next_row": next_row}),
        ),
        Some(outage) => json(
            StatusCode::SERVICE_UNAVAILABLE,
            &serde_json::json!({
                "status": "not_ready",
                "reason": outage.reason,
                "since_s": outage.since.elapsed().as_secs(),
                "dictionary": dictionary,
                "next_row": next_row,
            }),
        ),
    }
}

/// A chat request through the pipeline, counted.
async fn piped(req: Request<Incoming>, state: Arc<State>, format: wire::Format) -> Response<Body> {
    state
        .metrics
        .count(metrics::Event::Request(metrics::Route::Chat(format)));
    let answered = chat(req, Arc::clone(&state), format).await;
    counted(&state, answered.unwrap_or_else(Response::from))
}

/// Count what the proxy answered itself: refusals and upstream failures (marked by the
/// `x-perpetuity-error` header on its own error responses).
fn counted(state: &State, response: Response<Body>) -> Response<Body> {
    match response
        .headers()
        .get(PROXY_ERROR)
        .map(HeaderValue::as_bytes)
    {
        Some(b"upstream") => state.metrics.count(metrics::Event::UpstreamFailed),
        Some(_) => state.metrics.count(metrics::Event::Refused),
        None => {}
    }
    response
}

/// A query value percent-decoded (`%2F` is `/`, `+` a space); `None` for a broken escape or
/// bytes that are not UTF-8.
fn percent_decoded(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3)?;
                if !hex.iter().all(u8::is_ascii_hexdigit) {
                    return None;
                }
                out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::percent_decoded;

    #[test]
    fn query_values_are_percent_decoded() {
        assert_eq!(
            percent_decoded("%2Fsrv%2Fmy+tables%2Fv%C3%A9").as_deref(),
            Some("/srv/my tables/vé")
        );
        assert_eq!(percent_decoded("plain-v2").as_deref(), Some("plain-v2"));
        for broken in ["%2", "%zz", "%+1a", "%FF"] {
            assert_eq!(percent_decoded(broken), None, "{broken}");
        }
    }
}
