//! The HTTP front: a drop-in base URL for OpenAI Chat Completions and Anthropic Messages.
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
pub mod wire;

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

use crate::config::{AdminToken, FileConfig};
use crate::engine::{Author, Engine, Exclusions, Generation};
use crate::error::Error;
use crate::recall::{Ask, Recall, RecallConfig};
use crate::store::StoreError;
use crate::types::{Role, RowId, UserId, now_ms};

use deadline::Deadline;
use identity::{CONVERSATION_HEADER, Groups, Secret, USER_HEADER};
use provider::{Failure, Provider};
use turns::{TurnFrame, TurnKey, Turns};

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
            max_concurrent: 256,
            admin_token: None,
            recall: RecallConfig::default(),
            tools: true,
            tool_rounds: rounds::DEFAULT_ROUNDS,
            groups: Groups::default(),
            recent: recent::Limits::default(),
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
        set(&mut config.recall.mandatory_hits, recall.mandatory_hits);
        set(&mut config.recall.recent_tokens, recall.recent_tokens);
        set(&mut config.recall.warm_floor, recall.warm_floor);
        set(&mut config.recent.per_user, file.inspector.recent_requests);
        set(&mut config.recent.bytes, file.inspector.recent_bytes);
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
    client: HttpsClient,
    /// Responses replies a memory round continued, for their `previous_response_id`.
    continued: rounds::Continued,
    /// The frames of recent turns, reused by their tool-round continuations.
    turns: Turns,
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
            config,
            metrics: metrics::Metrics::default(),
            health: health::Health::default(),
            client,
            continued: rounds::Continued::default(),
            turns: Turns::default(),
            recent,
        }
    }
}

impl State {
    /// Chat requests holding one of the [`ProxyConfig::max_concurrent`] slots now.
    pub fn requests_in_flight(&self) -> usize {
        self.config.max_concurrent - self.permits.available_permits()
    }
}

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

/// Serve every connection the listener takes. A failed accept (the process out of descriptors,
/// a connection reset before it was taken) leaves the listener usable: it is logged and
/// retried after a wait that doubles while accepts keep failing, so the connections being
/// served can finish and give their descriptors back.
async fn accept(listener: TcpListener, state: Arc<State>) -> Infallible {
    let mut backoff = ACCEPT_BACKOFF.0;
    loop {
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
    Ok(match (req.method(), path.as_str()) {
        (&Method::GET, "/healthz") => healthz(&state),
        (&Method::GET | &Method::POST, EXCLUSIONS_PATH) => exclusions(req, state).await,
        (&Method::GET, "/metrics") => {
            let mut response =
                Response::new(Full::new(Bytes::from(metrics::render_metrics(&state))).boxed());
            response.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            response
        }
        (&Method::POST, "/v1/chat/completions") => {
            piped(req, state, wire::Format::Chat, metrics::Route::OpenAiChat).await
        }
        (&Method::POST, "/v1/responses") => {
            piped(
                req,
                state,
                wire::Format::Responses,
                metrics::Route::OpenAiResponses,
            )
            .await
        }
        (&Method::POST, "/v1/messages") => {
            piped(
                req,
                state,
                wire::Format::Messages,
                metrics::Route::AnthropicMessages,
            )
            .await
        }
        (&Method::POST, path) if gemini_model(path).is_some() => {
            piped(
                req,
                state,
                wire::Format::Gemini,
                metrics::Route::GeminiGenerate,
            )
            .await
        }
        _ => {
            state
                .metrics
                .count(metrics::Event::Request(metrics::Route::PassThrough));
            counted(&state, pass_through(req, Arc::clone(&state)).await)
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

/// The Gemini API's versions: the stable `v1` (the path `google-genai` 3.x calls by default)
/// and the previews, which only Gemini serves.
const GEMINI_VERSIONS: [&str; 3] = ["/v1/", "/v1beta/", "/v1alpha/"];

/// The model of a Gemini `generateContent` / `streamGenerateContent` path, in any of
/// [`GEMINI_VERSIONS`].
fn gemini_model(path: &str) -> Option<&str> {
    let rest = GEMINI_VERSIONS
        .iter()
        .find_map(|version| path.strip_prefix(version))?;
    let (model, method) = rest.strip_prefix("models/")?.split_once(':')?;
    (matches!(method, "generateContent" | "streamGenerateContent") && !model.is_empty())
        .then_some(model)
}

/// A chat request through the pipeline, counted.
async fn piped(
    req: Request<Incoming>,
    state: Arc<State>,
    format: wire::Format,
    route: metrics::Route,
) -> Response<Body> {
    state.metrics.count(metrics::Event::Request(route));
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

/// The per-request switches (headers; `docs/proxy.md`).
#[derive(Debug, Clone, Copy)]
struct Switches {
    capture: bool,
    recall: bool,
    probe: bool,
    tools: bool,
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
            tools: switch("x-perpetuity-tools", true),
        }
    }

    /// A harness's side call: nothing captured, no frame, no tools.
    fn side_call(self) -> Self {
        Self {
            capture: false,
            recall: false,
            tools: false,
            ..self
        }
    }

    /// Whether anything of this request is written (capture, reheat, the reply).
    fn writes(self) -> bool {
        self.capture && !self.probe
    }

    /// Whether the memory tools ride along with a request in `format` (with its frame).
    fn tools(self, config: &ProxyConfig, format: wire::Format) -> bool {
        self.tools && config.tools && config.tool_rounds > 1 && rounds::supports(format)
    }
}

/// Who is asking, in which conversation, and whose rows its search reads.
#[derive(Debug, Clone)]
struct Identity {
    user_key: String,
    conversation: String,
    /// The asker's user id, then its group scope's other members' ([`Groups::scope`]).
    scope: Vec<UserId>,
    /// The store's purge epoch when the request arrived: what it captures after a purge of
    /// the asker is dropped.
    since: u64,
    /// The credential's own user when `x-perpetuity-user` narrows it: the sub-user is linked
    /// to it before it is first written, so a purge of the credential finds it.
    owner: Option<UserId>,
}

impl Identity {
    /// Whom this request's captures belong to.
    fn author(&self) -> Author<'_> {
        Author {
            user_key: &self.user_key,
            conversation: &self.conversation,
            since: self.since,
            owner: self.owner,
        }
    }
}

/// One of the [`ProxyConfig::max_concurrent`] slots for a request to `provider`, held until its
/// response has been relayed; without a free one, 503 in the provider's shape.
fn admit(
    state: &Arc<State>,
    provider: Provider,
) -> Result<tokio::sync::OwnedSemaphorePermit, Refusal> {
    Arc::clone(&state.permits).try_acquire_owned().map_err(|_| {
        Refusal::new(
            provider,
            Failure::Overloaded,
            &format!(
                "the proxy is serving its limit of {} requests at once; retry shortly",
                state.config.max_concurrent
            ),
        )
    })
}

/// A request the proxy answers itself instead of with the upstream's reply (refused, or the
/// upstream failed or was not reached), already the response the client gets: an error in
/// the provider's shape. Handlers pass it up with `?`.
struct Refusal(Box<Response<Body>>);

impl Refusal {
    /// `failed`, saying `message`, in `provider`'s shape ([`failure`]).
    fn new(provider: Provider, failed: Failure, message: &str) -> Self {
        Self(Box::new(failure(provider, failed, message)))
    }
}

impl From<Refusal> for Response<Body> {
    fn from(refusal: Refusal) -> Self {
        *refusal.0
    }
}

/// A chat request through the pipeline.
async fn chat(
    req: Request<Incoming>,
    state: Arc<State>,
    format: wire::Format,
) -> Result<Response<Body>, Refusal> {
    let provider = format.provider();
    let permit = admit(&state, provider)?;
    let started = std::time::Instant::now();
    let (parts, body) = req.into_parts();
    let credential = credential_of(
        provider,
        &parts,
        "no API key: send the provider's credential (Authorization: Bearer; x-api-key for Anthropic; x-goog-api-key or ?key= for Gemini)",
    )?;
    if provider == Provider::Anthropic && !parts.headers.contains_key("anthropic-version") {
        return Err(Refusal::new(
            provider,
            Failure::InvalidRequest,
            "the anthropic-version header is required",
        ));
    }
    let bytes = request_body(body, &state.config, provider).await?;
    let path_model = gemini_model(parts.uri.path()).map(str::to_owned);
    // Shared with the blocking memory task, not copied: a body's parsed tree is many times its
    // size.
    let invalid = |reason: String| Refusal::new(provider, Failure::InvalidRequest, &reason);
    let request = Arc::new(wire::parse(format, &bytes, path_model.as_deref()).map_err(invalid)?);
    let switches = Switches::from(&parts.headers);
    let switches = if harness::is_side_call(&request.body, &request.messages, &parts.headers) {
        switches.side_call()
    } else {
        switches
    };
    let narrow = utf8_header(&parts.headers, USER_HEADER).map_err(invalid)?;
    let conversation = utf8_header(&parts.headers, CONVERSATION_HEADER).map_err(invalid)?;
    let identity = Identity {
        user_key: state.secret.user_key(&credential, narrow),
        scope: state
            .config
            .groups
            .scope(&state.secret, &credential, narrow)
            .iter()
            .map(|key| UserId::from_key(key))
            .collect(),
        owner: narrow.map(|_| UserId::from_key(&state.secret.user_key(&credential, None))),
        conversation: conversation
            .map(str::to_owned)
            .or_else(|| harness::session(format, &request.body, &parts.headers))
            .unwrap_or_else(|| identity::conversation_key(request.first.as_deref().unwrap_or(""))),
        since: state.engine.generation().memory.store.purge_epoch(),
    };
    // Continuing a reply that a memory round continued names the response holding all of it.
    let bytes = match request
        .body
        .get("previous_response_id")
        .filter(|_| request.server_history)
        .and_then(serde_json::Value::as_str)
        .and_then(|id| {
            state
                .continued
                .resolve(UserId::from_key(&identity.user_key), id)
        }) {
        Some(latest) => {
            let mut body = request.body.clone();
            body.insert(
                "previous_response_id".into(),
                serde_json::Value::String(latest),
            );
            Bytes::from(wire::encode(
                &request,
                &body,
                None,
                &["previous_response_id"],
            ))
        }
        None => bytes,
    };

    // Not ready: the storage failed and its probe has not yet written again. Nothing is
    // captured; the request goes through untouched.
    let remembered = if state.health.ready() {
        let (state, request, identity) =
            (Arc::clone(&state), Arc::clone(&request), identity.clone());
        Some(
            tokio::task::spawn_blocking(move || remember(&state, &request, &identity, switches))
                .await,
        )
    } else {
        None
    };
    let (mut remembered, dictionary) = match remembered {
        Some(Ok((remembered, dictionary))) => (Some(Ok(remembered)), dictionary),
        Some(Err(err)) => (
            Some(Err(err)),
            state
                .engine
                .generation()
                .memory
                .dictionary
                .version()
                .to_owned(),
        ),
        None => (
            None,
            state
                .engine
                .generation()
                .memory
                .dictionary
                .version()
                .to_owned(),
        ),
    };
    state.metrics.memory_time(started.elapsed());
    let mut question_stored = matches!(&remembered, Some(Ok(r)) if r.question_stored);
    let deferred = match &mut remembered {
        Some(Ok(remembered)) => std::mem::take(&mut remembered.deferred),
        _ => Deferred::default(),
    };
    let tools = switches.tools(&state.config, format);
    let mut tool_base = None;
    let (outbound, mut memory_status, turn, recall) = match remembered.map(|r| r.map(|r| r.recall))
    {
        Some(Ok(Ok(Some(recalled)))) => {
            if let Some((rows, us)) = recalled.scanned {
                state.metrics.scanned(rows, Duration::from_micros(us));
            }
            let wire::Framed { mut body, verbatim } = wire::framed(&request, &recalled.turn.items);
            if tools {
                rounds::offer(format, &mut body);
            }
            let owned: &[&str] = if tools {
                &[format.list(), "tools"]
            } else {
                &[format.list()]
            };
            let bytes = wire::encode(&request, &body, Some(&verbatim), owned);
            if tools {
                tool_base = Some(body);
            }
            (
                Bytes::from(bytes),
                "ok",
                Some(recalled.turn),
                recalled.recall,
            )
        }
        Some(Ok(Ok(None))) => (bytes, "off", None, None),
        Some(Ok(Err(err @ Error::Store(StoreError::TooLong { .. })))) => {
            return Err(Refusal::new(provider, Failure::TooLarge, &err.to_string()));
        }
        Some(Ok(Err(err))) => {
            tracing::error!(%err, "memory unavailable; forwarding the request untouched");
            state.health.report("remembering a request", &err);
            state.metrics.count(metrics::Event::MemoryUnavailable);
            (bytes, "unavailable", None, None)
        }
        None => {
            state.metrics.count(metrics::Event::MemoryUnavailable);
            (bytes, "unavailable", None, None)
        }
        Some(Err(err)) => {
            tracing::error!(%err, "memory task failed; forwarding the request untouched");
            state.metrics.count(metrics::Event::MemoryUnavailable);
            (bytes, "unavailable", None, None)
        }
    };

    let upstream = forward(&state, provider, &parts, outbound.clone()).await;
    // Only the provider's refusal of the credential drops what waited for it: an upstream
    // that failed or did not answer in time refused nothing.
    if !deferred.messages.is_empty() {
        if let Ok(refused) = &upstream
            && matches!(
                refused.status(),
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
            )
        {
            tracing::info!(status = %refused.status(), "the provider refused a credential that owns no memory: nothing of the request is stored");
        } else {
            let (waited, identity) = (Arc::clone(&state), identity.clone());
            match tokio::task::spawn_blocking(move || {
                capture_deferred(&waited, &identity, deferred)
            })
            .await
            {
                Ok(Ok(stored)) => question_stored = stored,
                Ok(Err(err)) => {
                    tracing::error!(%err, "capturing what waited for the provider failed");
                    state.health.report("capturing a request", &err);
                    state.metrics.count(metrics::Event::MemoryUnavailable);
                    memory_status = "unavailable";
                }
                Err(err) => {
                    tracing::error!(%err, "the capture task failed");
                    state.metrics.count(metrics::Event::MemoryUnavailable);
                    memory_status = "unavailable";
                }
            }
        }
    }
    // A request the provider refused the credential of leaves nothing, here as in the store.
    let refused = upstream.as_ref().is_ok_and(|answer| {
        matches!(
            answer.status(),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
        )
    });
    let log = (state.recent.enabled() && !refused).then(|| {
        Arc::new(recent::Logged {
            id: state.recent.number(),
            user: UserId::from_key(&identity.user_key),
            at_ms: now_ms(),
            format: format.name(),
            model: request.model.clone(),
            conversation: identity.conversation.clone(),
            question: request.question.clone(),
            memory: memory_status,
            question_stored,
            forwarded: outbound,
            reused: turn.is_some() && recall.is_none(),
            tools: tool_base.is_some(),
            recall,
            after: Mutex::new(recent::After {
                status: upstream.as_ref().ok().map(|r| r.status().as_u16()),
                ..recent::After::default()
            }),
        })
    });
    if let Some(log) = &log {
        state.recent.keep(Arc::clone(log));
        // A purge that ran meanwhile may have missed it.
        if state.engine.generation().memory.store.purge_epoch() != identity.since {
            state.recent.forget_users(&[log.user]);
        }
    }
    let upstream =
        upstream.map_err(|(failed, message)| Refusal::new(provider, failed, &message))?;
    state.metrics.first_byte(started.elapsed());
    let mut report = HeaderMap::new();
    report.insert(
        "x-perpetuity-memory",
        HeaderValue::from_static(memory_status),
    );
    if let Ok(version) = HeaderValue::from_str(&dictionary) {
        report.insert("x-perpetuity-dictionary", version);
    }
    if question_stored {
        acknowledge(&mut report, "question");
    }
    if let Some(turn) = &turn {
        for (name, value) in [
            ("x-perpetuity-retrieved", turn.retrieved.len()),
            ("x-perpetuity-frame-tokens", turn.tokens),
            ("x-perpetuity-trimmed", turn.trimmed),
        ] {
            report.insert(name, HeaderValue::from(value));
        }
    }
    let reply = (memory_status != "unavailable" && switches.writes()).then(|| Reply {
        state: Arc::clone(&state),
        format,
        identity: identity.clone(),
        model: request.model.clone(),
        log: log.clone(),
    });
    if let (Some(base), Some(recalled)) = (tool_base, &turn) {
        let turn = crate::memory_tools::TurnState::new(
            UserId::from_key(&identity.user_key),
            &identity.scope,
            Some(now_ms()),
            recalled.retrieved.clone(),
            &recalled.shown,
        );
        let tool_loop = rounds::Loop {
            state: Arc::clone(&state),
            parts,
            format,
            base,
            turn,
            reply,
            log,
            permit,
        };
        return Ok(rounds::answer_with_rounds(tool_loop, upstream, report).await);
    }
    Ok(answer(
        upstream,
        report,
        provider,
        Some(format),
        reply,
        &state.config,
        Some(permit),
    )
    .await)
}

/// Where a credential's user reads and changes its exclusions.
pub const EXCLUSIONS_PATH: &str = "/perpetuity/exclusions";

/// The request's one credential for `provider`: none is 401 (`missing` says what to send), two
/// different ones 400, each in the provider's shape.
fn credential_of(
    provider: Provider,
    parts: &hyper::http::request::Parts,
    missing: &str,
) -> Result<String, Refusal> {
    match provider.credential(&parts.headers, parts.uri.query()) {
        Ok(Some(credential)) => Ok(credential),
        Ok(None) => Err(Refusal::new(provider, Failure::Authentication, missing)),
        Err(reason) => Err(Refusal::new(provider, Failure::InvalidRequest, &reason)),
    }
}

/// `POST /perpetuity/exclusions`' body: rows to exclude (or include again, with
/// `"excluded": false`), by id or as every row of a conversation.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ExclusionChange {
    #[serde(default)]
    rows: Vec<u64>,
    conversation: Option<String>,
    #[serde(default = "yes")]
    excluded: bool,
}

fn yes() -> bool {
    true
}

/// `GET` or `POST` [`EXCLUSIONS_PATH`]: the asking user's exclusions (`docs/proxy.md`). The user
/// is the request's credential, narrowed by `x-perpetuity-user`, as for a chat request; errors
/// come in the shape of the provider the credential's header names.
async fn exclusions(req: Request<Incoming>, state: Arc<State>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let provider = Provider::from_headers(&parts.headers).unwrap_or(Provider::OpenAi);
    let credential = match credential_of(
        provider,
        &parts,
        "no API key: exclusions belong to the credential's memory (send it as for a chat request)",
    ) {
        Ok(credential) => credential,
        Err(refused) => return refused.into(),
    };
    let narrow = match utf8_header(&parts.headers, USER_HEADER) {
        Ok(narrow) => narrow.map(str::to_owned),
        Err(reason) => return failure(provider, Failure::InvalidRequest, &reason),
    };
    let change = if parts.method == Method::POST {
        let bytes = match request_body(body, &state.config, provider).await {
            Ok(bytes) => bytes,
            Err(refused) => return refused.into(),
        };
        match serde_json::from_slice::<ExclusionChange>(&bytes) {
            Ok(change) => Some(change),
            Err(err) => {
                return failure(
                    provider,
                    Failure::InvalidRequest,
                    &format!(
                        "the body must be {{\"rows\": [ids], \"conversation\": \"name\", \"excluded\": true|false}}: {err}"
                    ),
                );
            }
        }
    } else {
        None
    };
    let user = UserId::from_key(&state.secret.user_key(&credential, narrow.as_deref()));
    let done = tokio::task::spawn_blocking(move || change_exclusions(&state, user, change)).await;
    match done {
        Ok(Ok(body)) => json(StatusCode::OK, &body),
        Ok(Err(err)) => {
            tracing::error!(%err, "exclusions failed");
            failure(
                provider,
                Failure::Overloaded,
                &format!("the memory is unavailable: {err}"),
            )
        }
        Err(err) => failure(
            provider,
            Failure::Overloaded,
            &format!("the memory task failed: {err}"),
        ),
    }
}

/// Apply `change` (if any) to `user`'s exclusions; the rows it changed and every row now
/// excluded, in id order. The credential's endpoint and the inspector both call it.
fn change_exclusions(
    state: &State,
    user: UserId,
    change: Option<ExclusionChange>,
) -> Result<serde_json::Value, Error> {
    let exclusions = match change {
        Some(change) => state.engine.exclude(
            user,
            change.rows.into_iter().map(RowId).collect(),
            change.conversation.as_deref(),
            change.excluded,
        )?,
        None => Exclusions {
            excluded: state.engine.exclusions(user)?,
            ..Exclusions::default()
        },
    };
    let ids = |rows: &[RowId]| rows.iter().map(|r| r.0).collect::<Vec<_>>();
    Ok(serde_json::json!({
        "changed": ids(&exclusions.changed),
        "excluded": ids(&exclusions.excluded),
    }))
}

/// A header's value as text, `Ok(None)` when absent. Any UTF-8 is taken (a user's name may be
/// "José"; `HeaderValue::to_str` takes visible ASCII only, and dropping the rest would put such a
/// user in the credential's shared memory); other bytes are refused.
fn utf8_header<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, String> {
    headers
        .get(name)
        .map(|value| {
            std::str::from_utf8(value.as_bytes())
                .map_err(|_| format!("the {name} header is not UTF-8 text"))
        })
        .transpose()
}

/// What [`remember`] did: whether the question was committed, and the turn's frame (`Ok(None)`
/// when recall is off or there is no question to recall for).
struct Remembered {
    question_stored: bool,
    recall: Result<Option<Recalled>, Error>,
    /// What waits for the provider to accept the credential.
    deferred: Deferred,
}

/// The captures of a request whose credential owns no memory yet: written once the provider
/// has answered it with anything but 401 or 403, dropped otherwise, so a credential the
/// provider refuses leaves nothing behind (`docs/proxy.md`).
#[derive(Default)]
struct Deferred {
    /// Role and text of each message, in order.
    messages: Vec<(Role, String)>,
    /// The first message is the turn's question.
    question: bool,
    /// The turn's key, noted as captured once the question is.
    key: Option<TurnKey>,
}

/// How long a question stays known as captured: the same question at the same place of the
/// same conversation within it is a client's retry (after a 429, a 5xx, a dropped
/// connection) and is not stored again.
const RETRY_WINDOW: Duration = Duration::from_secs(120);

/// The frame a request is forwarded with.
struct Recalled {
    turn: Arc<TurnFrame>,
    /// The recall that made it (none: a continuation reused its turn's frame), for the
    /// inspector's log.
    recall: Option<Recall>,
    /// Rows scanned and the scan's time (µs), when this request scanned (a continuation that
    /// reuses its turn's frame does not).
    scanned: Option<(usize, u64)>,
}

/// Capture the new user turn and recall for the live question, as the switches allow, under
/// one serving generation; returns what it did with that generation's dictionary version.
fn remember(
    state: &State,
    request: &wire::Request,
    identity: &Identity,
    switches: Switches,
) -> (Remembered, String) {
    let generation = state.engine.writing();
    let remembered = remember_in(state, &generation, request, identity, switches);
    (
        remembered,
        generation.memory.dictionary.version().to_owned(),
    )
}

/// A new turn is captured and its frame recalled and kept for the turn; a continuation of a
/// tool round reuses its turn's frame (recalled again, its own question and round hidden, when
/// the turn is not remembered) and captures what the agent did since the last request. A
/// question captured moments ago at the same place is a retry and is not captured again; the
/// captures of a credential that owns no memory yet wait for the provider ([`Deferred`]).
fn remember_in(
    state: &State,
    generation: &Generation,
    request: &wire::Request,
    identity: &Identity,
    switches: Switches,
) -> Remembered {
    let memory = &generation.memory;
    let user = UserId::from_key(&identity.user_key);
    let key = Turns::key(&identity.user_key, &identity.conversation, request);
    let new = request.question_is_new();
    let retry = new && key.is_some_and(|key| state.turns.captured_within(&key, RETRY_WINDOW));
    let failed = |question_stored, err| Remembered {
        question_stored,
        recall: Err(err),
        deferred: Deferred::default(),
    };
    let owned = if switches.writes() {
        match memory.store.user_key(user) {
            Ok(owned) => owned.is_some(),
            Err(err) => return failed(false, err.into()),
        }
    } else {
        false
    };
    let mut deferred = Deferred {
        key,
        ..Deferred::default()
    };
    let mut stored = retry;
    if switches.writes() && new && !retry {
        let text = request.question.clone().unwrap_or_default();
        if owned {
            match generation.capture(&identity.author(), Role::User, None, text) {
                Ok(ids) => {
                    stored = ids.first().is_some_and(|ids| !ids.is_empty());
                    if let (true, Some(key)) = (stored, key) {
                        state.turns.note_captured(key, user);
                    }
                }
                Err(err) => return failed(false, err),
            }
        } else {
            deferred.messages.push((Role::User, text));
            deferred.question = true;
        }
    }
    let known = key.filter(|_| !new).and_then(|key| state.turns.get(&key));
    let recalled = match known {
        Some(turn) => Ok(Some(Recalled {
            turn,
            recall: None,
            scanned: None,
        })),
        None => {
            let hidden = if new || !switches.recall {
                Ok(Vec::new())
            } else {
                own_turn(memory, user, &identity.conversation)
            };
            hidden.and_then(|hidden| {
                let recalled = recall_for(
                    state, generation, request, identity, switches, stored, &hidden,
                )?;
                Ok(recalled.inspect(|recalled| {
                    if !new {
                        // What came before the round's last step was stored before the turn
                        // was forgotten.
                        *recalled.turn.captured.lock() = wire::last_step(request);
                    }
                    if let Some(key) = key {
                        state.turns.insert(key, Arc::clone(&recalled.turn));
                    }
                }))
            })
        }
    };
    if let (true, false, Ok(Some(recalled))) = (switches.writes(), new, &recalled) {
        let rows = round_rows(request, &recalled.turn);
        if owned {
            for text in rows {
                if let Err(err) = generation.capture(&identity.author(), Role::Tool, None, text) {
                    return failed(stored, err);
                }
            }
        } else {
            deferred
                .messages
                .extend(rows.into_iter().map(|text| (Role::Tool, text)));
        }
    }
    Remembered {
        question_stored: stored,
        recall: recalled,
        deferred,
    }
}

/// Rows a continuation's recall hides: the conversation's newest rows back to its newest user
/// message (the turn's question, then its tool rows), which the request forwards itself.
fn own_turn(
    memory: &crate::memory::Memory,
    user: UserId,
    conversation: &str,
) -> Result<Vec<RowId>, Error> {
    let mut hidden = Vec::new();
    for id in memory
        .store
        .conversation_rows_newest_first(user, conversation)
        .take(OWN_TURN_ROWS)
    {
        let id = id?;
        hidden.push(id);
        if memory
            .store
            .row(user, id)?
            .is_some_and(|row| row.role == Role::User && row.chunk == 0)
        {
            return Ok(hidden);
        }
    }
    Ok(Vec::new())
}

/// How far back [`own_turn`] looks for the question (rows); a turn whose tool rows run longer
/// hides nothing.
const OWN_TURN_ROWS: usize = 4096;

/// What the agent did since the turn's last request (its calls and their results after the
/// question), as the texts of the turn's tool rows, each once: the turn counts them as taken.
fn round_rows(request: &wire::Request, turn: &TurnFrame) -> Vec<String> {
    let mut captured = turn.captured.lock();
    let (texts, seen) = wire::round_rows(request, *captured);
    *captured = seen.max(*captured);
    texts
}

/// Write the captures that waited for the provider (which has not refused the credential);
/// whether the turn's question is among what was stored.
fn capture_deferred(state: &State, identity: &Identity, deferred: Deferred) -> Result<bool, Error> {
    let generation = state.engine.writing();
    let mut question = deferred.question;
    for (i, (role, text)) in deferred.messages.into_iter().enumerate() {
        let ids = generation.capture(&identity.author(), role, None, text)?;
        if i == 0 && question {
            question = ids.first().is_some_and(|ids| !ids.is_empty());
            if let (true, Some(key)) = (question, deferred.key) {
                state
                    .turns
                    .note_captured(key, UserId::from_key(&identity.user_key));
            }
        }
    }
    Ok(question)
}

/// Catch the arena up and recall for the live question (`Ok(None)` when recall is off or
/// there is none); `stored`: the question was just captured (otherwise recall is a probe);
/// `hidden`: rows passed over this time.
fn recall_for(
    state: &State,
    generation: &Generation,
    request: &wire::Request,
    identity: &Identity,
    switches: Switches,
    stored: bool,
    hidden: &[RowId],
) -> Result<Option<Recalled>, Error> {
    let (true, false, Some(question)) = (
        switches.recall,
        request.server_history,
        request.question.as_deref(),
    ) else {
        return Ok(None);
    };
    let config = RecallConfig {
        tools: switches.tools(&state.config, request.format),
        ..state.config.recall
    };
    let ask = Ask {
        user: UserId::from_key(&identity.user_key),
        scope: &identity.scope,
        conversation: Some(&identity.conversation),
        question,
        probe: !stored || !switches.writes(),
        hidden,
        now_ms: Some(now_ms()),
    };
    let recall = generation.recall(&state.engine.kernels, &config, &ask)?;
    Ok(Some(Recalled {
        scanned: Some((recall.scanned_rows, recall.scan_us)),
        turn: Arc::new(TurnFrame {
            scope: identity.scope.clone(),
            items: wire::frame_items(request.format, &recall.frame),
            retrieved: recall.retrieved.iter().map(|r| RowId(r.row)).collect(),
            shown: recall.frame.rows.clone(),
            tokens: recall.frame.tokens,
            trimmed: recall.frame.omitted.turns,
            captured: Mutex::new(0),
        }),
        recall: Some(recall),
    }))
}

/// Where a finished reply is captured.
struct Reply {
    state: Arc<State>,
    format: wire::Format,
    identity: Identity,
    model: String,
    /// The request's entry in the inspector's log.
    log: Option<Arc<recent::Logged>>,
}

impl Reply {
    /// Store the reply's text as the assistant's turn (marked when the stream was cut short);
    /// whether it was committed.
    fn capture(self, text: String, complete: bool) -> bool {
        if text.is_empty() {
            return false;
        }
        let text = if complete {
            text
        } else {
            format!("{text}\n[reply truncated: the stream ended before the provider finished]")
        };
        let generation = self.state.engine.writing();
        let result = generation.capture(
            &self.identity.author(),
            Role::Assistant,
            Some(self.model),
            text,
        );
        match result {
            Ok(ids) if ids.first().is_some_and(|ids| !ids.is_empty()) => {
                self.state.metrics.count(metrics::Event::Reply {
                    truncated: !complete,
                });
                if let Some(log) = &self.log {
                    log.after.lock().reply = Some(complete);
                }
                true
            }
            Ok(_) => false,
            Err(err) => {
                tracing::error!(%err, provider = self.format.provider().name(), "capturing the reply failed");
                self.state.health.report("capturing a reply", &err);
                false
            }
        }
    }
}

/// Name `what` (`question`, `reply`) in the response's [`CAPTURED`] list. Only what is
/// committed before the answer leaves is named: a streamed reply, stored after its last byte,
/// never is.
fn acknowledge(headers: &mut HeaderMap, what: &str) {
    let list = match headers.get(CAPTURED).and_then(|v| v.to_str().ok()) {
        Some(list) => format!("{list}, {what}"),
        None => what.to_owned(),
    };
    headers.insert(
        CAPTURED,
        HeaderValue::from_str(&list).expect("the names are ASCII"),
    );
}

/// The upstream's answer, passed to the client: streamed event by event (and read for its text
/// on the way), or read whole. Headers from the pipeline are added.
async fn answer(
    upstream: Response<Incoming>,
    report: HeaderMap,
    provider: Provider,
    format: Option<wire::Format>,
    reply: Option<Reply>,
    config: &ProxyConfig,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
) -> Response<Body> {
    let (limit, idle) = (config.body_limit, config.stream_idle_timeout);
    let (mut parts, body) = upstream.into_parts();
    strip_upstream_headers(&mut parts.headers);
    parts.headers.extend(report);
    let streaming = is_event_stream(&parts.headers);
    let success = parts.status.is_success();
    if streaming {
        relay_unbuffered(&mut parts.headers);
        let (tx, rx) = mpsc::channel::<Bytes>(64);
        tokio::spawn(async move {
            let reader = format.map(|format| sse::StreamReader::new(format, limit));
            relay(body, tx, provider, reader, reply.filter(|_| success), idle).await;
            drop(permit);
        });
        return Response::from_parts(parts, Channel(rx).boxed());
    }
    match read_body(body, limit, idle, Failure::Timeout).await {
        Ok(bytes) => {
            if let (Some(reply), true) = (reply, success)
                && let Some(text) = format.and_then(|f| wire::reply_text(f, &bytes))
            {
                let stored = tokio::task::spawn_blocking(move || reply.capture(text, true)).await;
                if stored.unwrap_or(false) {
                    acknowledge(&mut parts.headers, "reply");
                }
            }
            Response::from_parts(parts, Full::new(bytes).boxed())
        }
        Err((Failure::Timeout, message)) => failure(provider, Failure::Timeout, &message),
        Err((_, message)) => failure(provider, Failure::Upstream, &message),
    }
}

/// Forward upstream frames to the client as they arrive, reading the reply's text; end the last
/// event with a blank line if the upstream did not; capture the reply at the end. A client that
/// goes away, or an upstream silent for `idle`, stops the relay, which drops (cancels) the
/// upstream request; what was received is captured, marked truncated.
async fn relay(
    mut body: Incoming,
    tx: mpsc::Sender<Bytes>,
    provider: Provider,
    mut reader: Option<sse::StreamReader>,
    reply: Option<Reply>,
    idle: Duration,
) {
    let mut client_gone = false;
    loop {
        let next = tokio::select! {
            next = tokio::time::timeout(idle, body.frame()) => next,
            () = tx.closed() => {
                client_gone = true;
                break;
            }
        };
        let Ok(Some(Ok(frame))) = next else {
            if next.is_err() {
                tracing::warn!(
                    provider = provider.name(),
                    ?idle,
                    "the upstream stream went silent; ending it"
                );
            }
            break;
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        // Read only what reached the client: the reply is complete once its closing event
        // was relayed.
        if tx.send(data.clone()).await.is_err() {
            client_gone = true;
            break;
        }
        if let Some(reader) = &mut reader {
            reader.feed(&data);
            if let Some(oversize) = reader.oversize() {
                tracing::warn!(
                    provider = provider.name(),
                    limit = oversize.limit,
                    "the upstream sent an over-long stream event or reply; ending it"
                );
                let error = provider.error_body(Failure::Upstream, &oversize.to_string());
                let mut end = b"\n\n".to_vec();
                end.extend(reader.error_event(&error));
                let _ = tx.send(Bytes::from(end)).await;
                break;
            }
        }
    }
    drop(body);
    if !client_gone && reader.as_ref().is_some_and(|r| !r.terminated()) {
        let _ = tx.send(Bytes::from_static(b"\n\n")).await;
    }
    drop(tx);
    if let (Some(reply), Some(reader)) = (reply, reader) {
        let (text, complete) = reader.finish();
        let _ = tokio::task::spawn_blocking(move || reply.capture(text, complete)).await;
    }
}

/// Any other route: forwarded untouched to the provider the credential names (Gemini also by
/// a preview version's path), and its answer streamed back.
async fn pass_through(req: Request<Incoming>, state: Arc<State>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let preview = GEMINI_VERSIONS[1..]
        .iter()
        .any(|version| parts.uri.path().starts_with(version));
    let provider = if preview {
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
    let permit = match admit(&state, provider) {
        Ok(permit) => permit,
        Err(refused) => return refused.into(),
    };
    let bytes = match request_body(body, &state.config, provider).await {
        Ok(bytes) => bytes,
        Err(refused) => return refused.into(),
    };
    match forward(&state, provider, &parts, bytes).await {
        Ok(upstream) => {
            answer(
                upstream,
                HeaderMap::new(),
                provider,
                None,
                None,
                &state.config,
                Some(permit),
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
    body: Bytes,
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
        .body(Full::new(body))
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

/// A client's request body within the size limit and the idle timeout, or the error to answer
/// in `provider`'s shape (413 over the limit, 400 when it stalls or breaks off).
async fn request_body(
    body: Incoming,
    config: &ProxyConfig,
    provider: Provider,
) -> Result<Bytes, Refusal> {
    read_body(
        body,
        config.body_limit,
        config.header_timeout,
        Failure::InvalidRequest,
    )
    .await
    .map_err(|(failed, message)| Refusal::new(provider, failed, &message))
}

/// Read a whole body, refusing more than `limit` bytes, and giving up when nothing arrives for
/// `idle` (`stalled` is the failure then: the client's or the upstream's), so a sender that
/// stops midway holds no connection, permit or buffer for longer than that.
async fn read_body<B>(
    body: B,
    limit: usize,
    idle: Duration,
    stalled: Failure,
) -> Result<Bytes, (Failure, String)>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut body = Limited::new(body, limit);
    let mut bytes = Vec::new();
    loop {
        match tokio::time::timeout(idle, body.frame()).await {
            Err(_) => {
                return Err((
                    stalled,
                    format!("the body stalled: nothing arrived for {idle:?}"),
                ));
            }
            Ok(None) => return Ok(Bytes::from(bytes)),
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    bytes.extend_from_slice(&data);
                }
            }
            Ok(Some(Err(err))) if err.is::<http_body_util::LengthLimitError>() => {
                return Err((
                    Failure::TooLarge,
                    format!("the body is larger than the limit of {limit} bytes"),
                ));
            }
            Ok(Some(Err(err))) => {
                return Err((
                    Failure::InvalidRequest,
                    format!("the body could not be read: {err}"),
                ));
            }
        }
    }
}

/// Whether `headers` announce an event stream (relayed as it arrives).
fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// Tell proxies in front of us not to buffer or cache a relayed event stream.
fn relay_unbuffered(headers: &mut HeaderMap) {
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    headers.insert(
        hyper::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache"),
    );
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

/// Remove from an upstream's response the hop-by-hop headers, its length (the body may be
/// rewritten) and any `x-perpetuity-*` header: only the proxy reports what it did (an
/// upstream's `x-perpetuity-captured` would claim a capture that never happened).
fn strip_upstream_headers(headers: &mut HeaderMap) {
    let names: Vec<HeaderName> = headers
        .keys()
        .filter(|n| {
            is_hop_by_hop(n)
                || *n == hyper::header::CONTENT_LENGTH
                || n.as_str().starts_with("x-perpetuity-")
        })
        .cloned()
        .collect();
    for name in names {
        headers.remove(name);
    }
}

/// An error the proxy answers itself, in `provider`'s shape.
fn failure(provider: Provider, failed: Failure, message: &str) -> Response<Body> {
    let mut response = json(failed.status(), &provider.error_body(failed, message));
    let kind = match failed {
        Failure::Upstream | Failure::Timeout => "upstream",
        Failure::InvalidRequest
        | Failure::Authentication
        | Failure::TooLarge
        | Failure::Overloaded => "refused",
    };
    response
        .headers_mut()
        .insert(PROXY_ERROR, HeaderValue::from_static(kind));
    response
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
