//! The memory inspector (`docs/proxy.md`, "Inspector"): a page served by the proxy itself, and
//! the JSON endpoints under `/perpetuity/api/` it calls (scripts can call them too).
//!
//! Who sees what: the operator, presenting the admin token as for `/admin/`, sees every user
//! and names one with `?user=KEY`; anyone else is the user its provider credential (narrowed by
//! `x-perpetuity-user`) is keyed to, exactly as for a chat request, and sees that memory alone.
//! Everything here reads in probe mode: nothing is captured, no activation is written.
//!
//! Stored turns are untrusted input. The page builds its views with `textContent` only, never
//! HTML from data, and every answer here carries a Content-Security-Policy that allows the
//! page's own script and style and nothing inline, so a turn holding `<script>` or
//! `<img onerror>` is shown as the text it is.

use std::sync::Arc;

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper::body::Incoming;
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use hyper::{HeaderMap, Method, Request, Response, StatusCode};
use serde::Deserialize;
use serde_json::json;

use crate::frame;
use crate::heat;
use crate::recall::{Ask, RecallConfig, recall};
use crate::store::Cf;
use crate::store::keys;
use crate::types::{RowId, UserId, now_ms};

use super::identity::USER_HEADER;
use super::provider::Provider;
use super::{Body, State, json as json_response, ops, utf8_header};

/// Where the inspector lives.
pub const PREFIX: &str = "/perpetuity/";

const PAGE: &str = include_str!("inspector/index.html");
const SCRIPT: &str = include_str!("inspector/inspector.js");
const STYLE: &str = include_str!("inspector/inspector.css");
const ICON: &str = include_str!("inspector/favicon.svg");

/// The page's own script and style, nothing inline, no other origin, no frames.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// The most turns one page of `GET /perpetuity/api/turns` holds, and its default.
const MAX_TURNS: usize = 500;
const DEFAULT_TURNS: usize = 100;
/// The most users one page of `GET /perpetuity/api/users` holds.
const MAX_USERS: usize = 1_000;

/// Who asks.
enum Viewer {
    /// The admin token: every user, named by `?user=KEY`.
    Operator,
    /// A provider credential: its own user's memory only.
    User(String),
}

/// An answer of the inspector: JSON, or one of the page's files, with the headers that keep
/// it inert in a browser.
fn guarded(mut response: Response<Body>) -> Response<Body> {
    let headers = response.headers_mut();
    for (name, value) in [
        ("content-security-policy", CONTENT_SECURITY_POLICY),
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "no-referrer"),
        ("x-frame-options", "DENY"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// A request refused before any memory is read: its status and what to tell the caller.
struct Refused(StatusCode, String);

impl Refused {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self(status, message.into())
    }

    fn answer(self) -> Response<Body> {
        error(self.0, &self.1)
    }
}

fn error(status: StatusCode, message: &str) -> Response<Body> {
    guarded(json_response(
        status,
        &json!({"error": {"message": message, "type": "inspector_error"}}),
    ))
}

fn asset(text: &'static str, content_type: &'static str) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())).boxed());
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    guarded(response)
}

/// Serve a request under [`PREFIX`].
pub async fn route(req: Request<Incoming>, state: Arc<State>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    match (req.method(), path.as_str()) {
        (&Method::GET, "/perpetuity/") => asset(PAGE, "text/html; charset=utf-8"),
        (&Method::GET, "/perpetuity/inspector.js") => {
            asset(SCRIPT, "text/javascript; charset=utf-8")
        }
        (&Method::GET, "/perpetuity/inspector.css") => asset(STYLE, "text/css; charset=utf-8"),
        (&Method::GET, "/perpetuity/favicon.svg") => asset(ICON, "image/svg+xml"),
        (&Method::GET, "/perpetuity/api/users")
        | (&Method::GET, "/perpetuity/api/turns")
        | (&Method::POST, "/perpetuity/api/frame") => api(req, state).await,
        (method, path) => error(
            StatusCode::NOT_FOUND,
            &format!("no inspector route {method} {path}"),
        ),
    }
}

/// The viewer a request's headers name: the operator (admin token) or a credential's user;
/// 401 without either.
fn viewer(state: &State, headers: &HeaderMap) -> Result<Viewer, Refused> {
    if ops::is_admin(state, headers) {
        return Ok(Viewer::Operator);
    }
    let provider = Provider::from_headers(headers).unwrap_or(Provider::OpenAi);
    let credential = match provider.credential(headers, None) {
        Ok(Some(credential)) => credential,
        Ok(None) => {
            return Err(Refused::new(
                StatusCode::UNAUTHORIZED,
                "the inspector needs the admin token, or the provider credential whose memory to see",
            ));
        }
        Err(reason) => return Err(Refused::new(StatusCode::BAD_REQUEST, reason)),
    };
    let narrow = utf8_header(headers, USER_HEADER)
        .map_err(|reason| Refused::new(StatusCode::BAD_REQUEST, reason))?;
    Ok(Viewer::User(state.secret.user_key(&credential, narrow)))
}

/// A query string's parameters, percent-decoded.
fn params(query: Option<&str>) -> Result<Vec<(String, String)>, Refused> {
    query
        .unwrap_or("")
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            super::percent_decoded(value)
                .map(|value| (name.to_owned(), value))
                .ok_or_else(|| {
                    Refused::new(
                        StatusCode::BAD_REQUEST,
                        format!("?{name}= is not percent-encoded UTF-8"),
                    )
                })
        })
        .collect()
}

/// The user key a request reads: the operator's `?user=KEY` (required), or the viewer's own
/// (a `?user=` naming anyone else is refused).
fn user_of(viewer: &Viewer, named: Option<&str>) -> Result<String, Refused> {
    match (viewer, named) {
        (Viewer::Operator, Some(key)) => Ok(key.to_owned()),
        (Viewer::Operator, None) => Err(Refused::new(
            StatusCode::BAD_REQUEST,
            "the operator names the user: ?user=KEY",
        )),
        (Viewer::User(own), Some(key)) if key != own => Err(Refused::new(
            StatusCode::FORBIDDEN,
            "a credential sees its own memory only",
        )),
        (Viewer::User(own), _) => Ok(own.clone()),
    }
}

/// `POST /perpetuity/api/frame`'s body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FrameAsk {
    question: String,
    conversation: Option<String>,
    /// The operator's choice of user (a credential's own otherwise).
    user: Option<String>,
}

/// One read the inspector runs on the blocking pool.
type Read = Box<dyn FnOnce() -> Result<serde_json::Value, crate::error::Error> + Send>;

async fn api(req: Request<Incoming>, state: Arc<State>) -> Response<Body> {
    let read = match prepare(req, &state).await {
        Ok(read) => read,
        Err(refused) => return refused.answer(),
    };
    match tokio::task::spawn_blocking(read).await {
        Ok(Ok(body)) => guarded(json_response(StatusCode::OK, &body)),
        Ok(Err(err)) => {
            tracing::error!(%err, "an inspector read failed");
            error(StatusCode::INTERNAL_SERVER_ERROR, &err.to_string())
        }
        Err(err) => error(StatusCode::INTERNAL_SERVER_ERROR, &err.to_string()),
    }
}

/// The read an API request asks for, its viewer and parameters checked.
async fn prepare(req: Request<Incoming>, state: &Arc<State>) -> Result<Read, Refused> {
    let (parts, body) = req.into_parts();
    let viewer = viewer(state, &parts.headers)?;
    let params = params(parts.uri.query())?;
    let param = |name: &str| {
        params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let count = |name: &str, default: usize, max: usize| match param(name) {
        None => Ok(default),
        Some(text) => match text.parse::<usize>() {
            Ok(n) if (1..=max).contains(&n) => Ok(n),
            _ => Err(Refused::new(
                StatusCode::BAD_REQUEST,
                format!("?{name}= is a count from 1 to {max}"),
            )),
        },
    };
    let state = Arc::clone(state);
    Ok(match parts.uri.path() {
        "/perpetuity/api/users" => {
            let limit = count("limit", MAX_USERS, MAX_USERS)?;
            let after = param("after").map(str::to_owned);
            Box::new(move || users(&state, &viewer, after.as_deref(), limit))
        }
        "/perpetuity/api/turns" => {
            let key = user_of(&viewer, param("user"))?;
            let limit = count("limit", DEFAULT_TURNS, MAX_TURNS)?;
            let after = param("after")
                .map(str::parse::<u64>)
                .transpose()
                .map_err(|_| Refused::new(StatusCode::BAD_REQUEST, "?after= is a row id"))?
                .unwrap_or(0);
            let conversation = param("conversation").map(str::to_owned);
            Box::new(move || turns(&state, &key, conversation.as_deref(), after, limit))
        }
        _ => {
            let bytes = super::request_body(body, &state.config, Provider::OpenAi)
                .await
                .map_err(|_| {
                    Refused::new(
                        StatusCode::BAD_REQUEST,
                        "the body could not be read (too large, or cut short)",
                    )
                })?;
            let ask: FrameAsk = serde_json::from_slice(&bytes).map_err(|err| {
                Refused::new(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "the body is {{\"question\": \"...\", \"conversation\": \"...\"}}: {err}"
                    ),
                )
            })?;
            let key = user_of(&viewer, ask.user.as_deref())?;
            Box::new(move || probe_frame(&state, &key, ask.conversation.as_deref(), &ask.question))
        }
    })
}

/// `GET /perpetuity/api/users`: every user's key and clock, in id order, a page at a time
/// (`?after=KEY` continues after that user); a credential's viewer sees itself only.
fn users(
    state: &State,
    viewer: &Viewer,
    after: Option<&str>,
    limit: usize,
) -> Result<serde_json::Value, crate::error::Error> {
    let store = &state.generation().memory.store;
    let mut listed = Vec::new();
    let mut next = None;
    let own = match viewer {
        Viewer::Operator => None,
        Viewer::User(key) => Some(UserId::from_key(key)),
    };
    let start = after.map(UserId::from_key);
    for entry in store.iter_all(Cf::Users) {
        let (key, value) = entry?;
        let Some(user) = keys::parse_user(&key) else {
            continue;
        };
        if start.is_some_and(|start| user <= start) || own.is_some_and(|own| own != user) {
            continue;
        }
        if listed.len() == limit {
            next = listed
                .last()
                .and_then(|last: &serde_json::Value| last["user"].as_str().map(str::to_owned));
            break;
        }
        listed.push(json!({
            "user": String::from_utf8_lossy(&value),
            "clock": store.clock(user)?,
            "excluded": store.exclusions(user)?.len(),
        }));
    }
    Ok(json!({"users": listed, "next_after": next}))
}

/// `GET /perpetuity/api/turns`: a user's stored turns after row `after` (in capture order,
/// `limit` of them; one conversation's with `?conversation=`), verbatim, each with its
/// speaker's name as the frame would label it, its time, its activation and warmth at the
/// user's clock now, and whether it is excluded.
fn turns(
    state: &State,
    key: &str,
    conversation: Option<&str>,
    after: u64,
    limit: usize,
) -> Result<serde_json::Value, crate::error::Error> {
    let store = &state.generation().memory.store;
    let user = UserId::from_key(key);
    let clock = store.clock(user)?;
    let excluded = store.exclusions(user)?;
    let warm = store.warm_of(user)?;
    let names = store.bound_names(user)?;
    let mut listed = Vec::new();
    let mut next = None;
    for row in store.rows_of_from(user, RowId(after.saturating_add(1))) {
        let row = row?;
        if conversation.is_some_and(|c| c != row.conversation) {
            continue;
        }
        if listed.len() == limit {
            next = Some(listed.len());
            break;
        }
        let activation = match warm.get(&row.id) {
            Some(activation) => *activation,
            None => store
                .activation(user, row.id)?
                .unwrap_or_else(|| heat::born(row.birth_clock, row.decay)),
        };
        let speaker = names
            .get(&(
                crate::types::ConversationId::from_key(&row.conversation),
                row.role,
            ))
            .map(|name| name.to_string())
            .or(row.name.clone());
        listed.push(json!({
            "row": row.id.0,
            "conversation": row.conversation,
            "message": row.message.0,
            "chunk": row.chunk,
            "chunks": row.chunks,
            "role": row.role,
            "name": row.name,
            "speaker": speaker,
            "time": row.timestamp_ms.and_then(frame::date_label),
            "timestamp_ms": row.timestamp_ms,
            "last_clock": activation.last_clock,
            "peak": activation.peak,
            "warmth": heat::warmth(&activation, clock),
            "excluded": excluded.contains(&row.id),
            "text": row.text,
        }));
    }
    let next_after = next.and_then(|_| listed.last().map(|last| last["row"].clone()));
    Ok(json!({"user": key, "clock": clock, "turns": listed, "next_after": next_after}))
}

/// `POST /perpetuity/api/frame`: the frame a question would get, in probe mode (what
/// `perpetuity frame --json` prints): the retrieved rows with their scores, the budget, and
/// each message of the frame with its tokens and rows.
fn probe_frame(
    state: &State,
    key: &str,
    conversation: Option<&str>,
    question: &str,
) -> Result<serde_json::Value, crate::error::Error> {
    let generation = state.generation();
    let memory = &generation.memory;
    generation
        .arena
        .write()
        .catch_up(&memory.store, &memory.dictionary)?;
    let arena = generation.arena.read();
    let user = UserId::from_key(key);
    let config = RecallConfig {
        tools: false,
        ..state.config.recall
    };
    let scope = [user];
    let ask = Ask::probe(&scope, conversation, question, now_ms());
    let recalled = recall(memory, &arena, &state.kernels, &config, &ask)?;
    Ok(serde_json::to_value(&recalled).expect("a recall serialises"))
}
