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

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper::body::Incoming;
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use hyper::{HeaderMap, Method, Request, Response, StatusCode};
use serde::Deserialize;
use serde_json::json;

use crate::engine::Generation;
use crate::frame;
use crate::heat;
use crate::recall::{Ask, Recall, RecallConfig};
use crate::store::Cf;
use crate::store::keys;
use crate::types::{ConversationId, RowId, UserId, now_ms};

use super::identity::USER_HEADER;
use super::provider::Provider;
use super::recent::Logged;
use super::{
    Body, MEMORY_FAILED, SIDE_BODY_LIMIT, SIDE_BUSY, State, UNVOUCHED, admin,
    json as json_response, utf8_header,
};
use crate::config::InspectorAccess;

mod read;

use read::*;

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

/// Serve a request under [`PREFIX`]; with `[inspector] access = "off"`, 404 for every one.
pub async fn route(req: Request<Incoming>, state: Arc<State>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    if state.config.inspector == InspectorAccess::Off {
        return error(
            StatusCode::NOT_FOUND,
            "the inspector is off on this server ([inspector] access)",
        );
    }
    match (req.method(), path.as_str()) {
        (&Method::GET, "/perpetuity/") => asset(PAGE, "text/html; charset=utf-8"),
        (&Method::GET, "/perpetuity/inspector.js") => {
            asset(SCRIPT, "text/javascript; charset=utf-8")
        }
        (&Method::GET, "/perpetuity/inspector.css") => asset(STYLE, "text/css; charset=utf-8"),
        (&Method::GET, "/perpetuity/favicon.svg") => asset(ICON, "image/svg+xml"),
        (&Method::GET, "/perpetuity/api/users")
        | (&Method::GET, "/perpetuity/api/conversations")
        | (&Method::GET, "/perpetuity/api/turns")
        | (&Method::GET, "/perpetuity/api/requests")
        | (&Method::GET, "/perpetuity/api/request")
        | (&Method::POST, "/perpetuity/api/frame")
        | (&Method::POST, "/perpetuity/api/search")
        | (&Method::POST, "/perpetuity/api/exclusions")
        | (&Method::POST, "/perpetuity/api/purge") => api(req, state).await,
        (method, path) => error(
            StatusCode::NOT_FOUND,
            &format!("no inspector route {method} {path}"),
        ),
    }
}

/// The viewer a request's headers name: the operator (admin token) or a credential's user;
/// 401 without either, 403 for a credential where the inspector is the operator's or the
/// provider has not vouched for it ([`State::vouched`]).
fn viewer(state: &State, headers: &HeaderMap) -> Result<Viewer, Refused> {
    if admin::is_admin(state, headers) {
        return Ok(Viewer::Operator);
    }
    if state.config.inspector == InspectorAccess::Operator {
        return Err(Refused::new(
            StatusCode::FORBIDDEN,
            "the inspector on this server is the operator's: send the admin token",
        ));
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
    if !state.vouched(&credential) {
        return Err(Refused::new(StatusCode::FORBIDDEN, UNVOUCHED));
    }
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
}

/// `POST /perpetuity/api/search`'s body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchAsk {
    query: String,
    limit: Option<usize>,
}

/// `POST /perpetuity/api/purge`'s body: the user's key again, so no script purges by mistake.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PurgeAsk {
    confirm: String,
}

/// The most rows one search returns, and its default.
const MAX_FOUND: usize = 100;
const DEFAULT_FOUND: usize = 20;

/// One read the inspector runs on the blocking pool.
type Read = Box<dyn FnOnce() -> Result<serde_json::Value, Failed> + Send>;

/// Why a read gave no answer: refused (the caller's mistake), or the memory failed.
enum Failed {
    Refused(Refused),
    Memory(crate::error::Error),
}

impl<E: Into<crate::error::Error>> From<E> for Failed {
    fn from(err: E) -> Self {
        Self::Memory(err.into())
    }
}

/// An API request: its viewer, parameters and body checked, then its read run on the blocking
/// pool in one of the [`super::SIDE_CONCURRENT`] slots (503 when none is free).
async fn api(req: Request<Incoming>, state: Arc<State>) -> Response<Body> {
    let read = match prepare(req, &state).await {
        Ok(read) => read,
        Err(refused) => return refused.answer(),
    };
    let Some(slot) = state.side_slot() else {
        return error(StatusCode::SERVICE_UNAVAILABLE, SIDE_BUSY);
    };
    let done = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        read()
    })
    .await;
    match done {
        Ok(Ok(body)) => guarded(json_response(StatusCode::OK, &body)),
        Ok(Err(Failed::Refused(refused))) => refused.answer(),
        Ok(Err(Failed::Memory(err))) => {
            tracing::error!(%err, "an inspector read failed");
            error(StatusCode::INTERNAL_SERVER_ERROR, MEMORY_FAILED)
        }
        Err(err) => {
            tracing::error!(%err, "an inspector task failed");
            error(StatusCode::INTERNAL_SERVER_ERROR, MEMORY_FAILED)
        }
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
    let number = |name: &str| {
        param(name)
            .map(str::parse::<u64>)
            .transpose()
            .map_err(|_| Refused::new(StatusCode::BAD_REQUEST, format!("?{name}= is a number")))
    };
    let state = Arc::clone(state);
    let path = parts.uri.path();
    if path == "/perpetuity/api/users" {
        let limit = count("limit", MAX_USERS, MAX_USERS)?;
        let after = param("after").map(str::to_owned);
        return Ok(Box::new(move || {
            users(&state, &viewer, after.as_deref(), limit)
        }));
    }
    let key = user_of(&viewer, param("user"))?;
    Ok(match path {
        "/perpetuity/api/conversations" => {
            let limit = count("limit", DEFAULT_CONVERSATIONS, MAX_CONVERSATIONS)?;
            let after = number("after")?.map(crate::types::ConversationId);
            Box::new(move || conversations(&state, &key, after, limit))
        }
        "/perpetuity/api/turns" => {
            let page = Page {
                conversation: param("conversation").map(str::to_owned),
                after: number("after")?.unwrap_or(0),
                limit: count("limit", DEFAULT_TURNS, MAX_TURNS)?,
                request: number("request")?,
            };
            Box::new(move || turns(&state, &key, &page))
        }
        "/perpetuity/api/requests" => Box::new(move || requests(&state, &key)),
        "/perpetuity/api/request" => {
            let id = number("id")?
                .ok_or_else(|| Refused::new(StatusCode::BAD_REQUEST, "?id= names the request"))?;
            Box::new(move || request(&state, &key, id))
        }
        "/perpetuity/api/frame" => {
            let ask: FrameAsk = body_of(
                body,
                &state,
                "{\"question\": \"...\", \"conversation\": \"...\"}",
            )
            .await?;
            Box::new(move || probe_frame(&state, &key, ask.conversation.as_deref(), &ask.question))
        }
        "/perpetuity/api/search" => {
            let ask: SearchAsk =
                body_of(body, &state, "{\"query\": \"...\", \"limit\": 20}").await?;
            let limit = ask.limit.unwrap_or(DEFAULT_FOUND);
            if !(1..=MAX_FOUND).contains(&limit) {
                return Err(Refused::new(
                    StatusCode::BAD_REQUEST,
                    format!("\"limit\" is a count from 1 to {MAX_FOUND}"),
                ));
            }
            Box::new(move || search(&state, &key, &ask.query, limit))
        }
        "/perpetuity/api/exclusions" => {
            let change: super::ExclusionChange = body_of(
                body,
                &state,
                "{\"rows\": [ids], \"conversation\": \"name\", \"excluded\": true|false}",
            )
            .await?;
            if let Some(reason) = change.refused() {
                return Err(Refused::new(StatusCode::BAD_REQUEST, reason));
            }
            Box::new(move || {
                let mut done =
                    super::change_exclusions(&state, UserId::from_key(&key), Some(change))?;
                done["user"] = json!(key);
                Ok(done)
            })
        }
        _ => {
            let ask: PurgeAsk = body_of(body, &state, "{\"confirm\": \"the user's key\"}").await?;
            if ask.confirm != key {
                return Err(Refused::new(
                    StatusCode::BAD_REQUEST,
                    "a purge is confirmed by naming the user's key again: {\"confirm\": KEY}",
                ));
            }
            Box::new(move || {
                let purged = admin::purge(&state, &key, false)?;
                Ok(json!({"user": key, "rows_removed": purged.rows}))
            })
        }
    })
}

/// A POST body read whole (within [`SIDE_BODY_LIMIT`] and the body deadline) and parsed as
/// `T`; `shape` says what it should look like when it does not parse.
async fn body_of<T: serde::de::DeserializeOwned>(
    body: Incoming,
    state: &State,
    shape: &str,
) -> Result<T, Refused> {
    let bytes = super::request_body(body, &state.config, SIDE_BODY_LIMIT, Provider::OpenAi)
        .await
        .map_err(|_| {
            Refused::new(
                StatusCode::BAD_REQUEST,
                format!(
                    "the body could not be read (over {SIDE_BODY_LIMIT} bytes, cut short or too slow)"
                ),
            )
        })?;
    serde_json::from_slice(&bytes).map_err(|err| {
        Refused::new(
            StatusCode::BAD_REQUEST,
            format!("the body is {shape}: {err}"),
        )
    })
}
