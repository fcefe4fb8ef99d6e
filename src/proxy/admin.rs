//! The admin endpoints behind the admin token (`docs/proxy.md`, "Operations"): stats,
//! integrity, backup, purge and the dictionary's install and flip, each the engine's operation
//! ([`crate::engine::Engine`]) with what the proxy keeps besides the memory (the turns' frames,
//! the inspector's log) and a thread for a re-derivation.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::{HeaderMap, Method, Request, Response, StatusCode};
use serde_json::json;

use crate::store::Purged;
use crate::types::UserId;

use super::{Body, State, json};

/// The admin endpoints: disabled without a configured token, refused without the right one.
pub(super) async fn route(req: Request<Incoming>, state: Arc<State>) -> Response<Body> {
    let plain = |status: StatusCode, message: &str| {
        json(
            status,
            &serde_json::json!({"error": {"message": message, "type": "admin_error"}}),
        )
    };
    if state.config.admin_token.is_none() {
        return plain(
            StatusCode::NOT_FOUND,
            "the admin endpoints are disabled (no admin token configured)",
        );
    }
    if !is_admin(&state, req.headers()) {
        return plain(
            StatusCode::UNAUTHORIZED,
            "the admin endpoints need the admin token",
        );
    }
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("");
    let param = |name: &str| -> Result<Option<String>, String> {
        query
            .split('&')
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
            .filter(|value| !value.is_empty())
            .map(|value| {
                super::percent_decoded(value)
                    .ok_or_else(|| format!("?{name}= is not percent-encoded UTF-8: {value:?}"))
            })
            .transpose()
    };
    let (user, credential_user, path_param, version) = match (
        param("user"),
        param("credential_user"),
        param("path"),
        param("version"),
    ) {
        (Ok(user), Ok(credential_user), Ok(path), Ok(version)) => {
            (user, credential_user, path, version)
        }
        (Err(reason), _, _, _)
        | (_, Err(reason), _, _)
        | (_, _, Err(reason), _)
        | (_, _, _, Err(reason)) => {
            return plain(StatusCode::BAD_REQUEST, &reason);
        }
    };
    let work = match (req.method(), path.as_str()) {
        (&Method::GET, "/admin/stats") => {
            return json(
                StatusCode::OK,
                &serde_json::to_value(state.engine.stats()).expect("stats serialise"),
            );
        }
        (&Method::GET, "/admin/integrity") => tokio::task::spawn_blocking(move || {
            state.engine.integrity().map(|report| {
                let status = if report.is_clean() {
                    StatusCode::OK
                } else {
                    StatusCode::CONFLICT
                };
                (
                    status,
                    serde_json::to_value(&report).expect("a report serialises"),
                )
            })
        }),
        (&Method::GET, "/admin/dictionary") => tokio::task::spawn_blocking(move || {
            dictionaries(&state).map(|listed| (StatusCode::OK, listed))
        }),
        (&Method::POST, "/admin/dictionary/install") => {
            let Some(path) = path_param else {
                return plain(StatusCode::BAD_REQUEST, "install needs ?path=DIR");
            };
            tokio::task::spawn_blocking(move || {
                install(&state, Path::new(&path)).map(|listed| (StatusCode::ACCEPTED, listed))
            })
        }
        (&Method::POST, "/admin/dictionary/flip") => {
            let Some(version) = version else {
                return plain(StatusCode::BAD_REQUEST, "flip needs ?version=VERSION");
            };
            tokio::task::spawn_blocking(move || {
                state.engine.flip(&version).map(|flipped| {
                    (
                        StatusCode::OK,
                        serde_json::to_value(&flipped).expect("a flip serialises"),
                    )
                })
            })
        }
        (&Method::POST, "/admin/backup") => {
            let Some(path) = path_param.map(PathBuf::from) else {
                return plain(StatusCode::BAD_REQUEST, "backup needs ?path=DEST");
            };
            if !path.is_absolute() {
                return plain(
                    StatusCode::BAD_REQUEST,
                    "backup needs an absolute ?path=DEST (a new folder on the server's machine)",
                );
            }
            tokio::task::spawn_blocking(move || {
                state.engine.backup(&path).map(|manifest| {
                    (
                        StatusCode::OK,
                        serde_json::to_value(&manifest).expect("a manifest serialises"),
                    )
                })
            })
        }
        (&Method::POST, "/admin/purge") => {
            let (user, sub_users) = match (user, credential_user) {
                (Some(user), None) => (user, false),
                (None, Some(user)) => (user, true),
                _ => {
                    return plain(
                        StatusCode::BAD_REQUEST,
                        "purge needs one of ?user=KEY and ?credential_user=KEY",
                    );
                }
            };
            tokio::task::spawn_blocking(move || {
                purge(&state, &user, sub_users).map(|purged| {
                    (
                        StatusCode::OK,
                        serde_json::json!({"user": user, "rows_removed": purged.rows,
                            "sub_users_removed": purged.sub_users.len()}),
                    )
                })
            })
        }
        (method, path) => {
            return plain(
                StatusCode::NOT_FOUND,
                &format!("no admin route {method} {path}"),
            );
        }
    };
    match work.await {
        Ok(Ok((status, body))) => json(status, &body),
        Ok(Err(err)) if err.is_swap_refusal() => plain(StatusCode::CONFLICT, &err.to_string()),
        Ok(Err(err)) if err.is_bad_version() => plain(StatusCode::BAD_REQUEST, &err.to_string()),
        Ok(Err(err)) if err.is_existing_destination() => {
            plain(StatusCode::CONFLICT, &err.to_string())
        }
        Ok(Err(err)) => plain(StatusCode::INTERNAL_SERVER_ERROR, &err.to_string()),
        Err(err) => plain(StatusCode::INTERNAL_SERVER_ERROR, &err.to_string()),
    }
}

/// Whether `headers` carry the configured admin token (`Authorization: Bearer` or
/// `x-perpetuity-admin-token`), compared in constant time. No token configured: never.
pub fn is_admin(state: &State, headers: &HeaderMap) -> bool {
    let Some(token) = &state.config.admin_token else {
        return false;
    };
    let given = headers
        .get("x-perpetuity-admin-token")
        .or_else(|| headers.get(hyper::header::AUTHORIZATION))
        .and_then(|v| v.to_str().ok())
        .map(|v| v.strip_prefix("Bearer ").unwrap_or(v).trim())
        .unwrap_or("");
    token.matches(given)
}

/// `POST /admin/purge?user=KEY`: remove a user's memory ([`crate::engine::Engine::purge`]);
/// with `sub_users` (`?credential_user=KEY`, KEY a credential's own user) its sub-users' too.
/// The turns' frames and the inspector's log forget every purged user before writes resume.
/// Returns what was removed.
pub fn purge(
    state: &State,
    user_key: &str,
    sub_users: bool,
) -> Result<Purged, crate::error::Error> {
    let user = UserId::from_key(user_key);
    state.engine.purge(user, sub_users, |purged| {
        for &user in purged {
            state.turns.forget(user);
            state.held.forget(user);
        }
        state.recent.forget_users(purged);
    })
}

/// `GET /admin/dictionary`: the data directory's dictionary versions and their states.
fn dictionaries(state: &State) -> Result<serde_json::Value, crate::error::Error> {
    Ok(json!({ "versions": state.engine.versions()? }))
}

/// `POST /admin/dictionary/install?path=DIR`: upload and install the dictionary in `DIR` dark,
/// and start re-deriving every stored row under it in the background.
fn install(state: &Arc<State>, path: &Path) -> Result<serde_json::Value, crate::error::Error> {
    state.engine.install(path)?;
    start_rederive(state);
    dictionaries(state)
}

/// How often a background re-derivation logs its progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// Re-derive the installed dark version's rows and build its arena generation on a thread of
/// its own and half the cores (progress logged every [`PROGRESS_EVERY`]), leaving the
/// generation for the flip ([`crate::engine::Engine::prepare_dark`]).
pub fn start_rederive(state: &Arc<State>) {
    let state = Arc::clone(state);
    std::thread::spawn(move || {
        let mut logged = Instant::now();
        let prepared = state.engine.prepare_dark(true, |progress| {
            if logged.elapsed() >= PROGRESS_EVERY || progress.is_derived() {
                logged = Instant::now();
                tracing::info!(
                    version = progress.version,
                    done = progress.done,
                    total = progress.total,
                    "re-deriving the dark dictionary version"
                );
            }
        });
        match prepared {
            Ok(Some(prepared)) => tracing::info!(
                version = prepared.version,
                rows = prepared.arena_rows,
                elapsed_ms = (prepared.derive_time + prepared.build_time).as_millis() as u64,
                "dark dictionary version ready to flip"
            ),
            Ok(None) => {}
            Err(err) => tracing::error!(%err, "re-deriving the dark version failed"),
        }
    });
}
