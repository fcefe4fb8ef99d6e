//! `/perpetuity/exclusions`: a user's own rows excluded from its recall, or included again.

use super::*;

/// Where a credential's user reads and changes its exclusions.
pub const EXCLUSIONS_PATH: &str = "/perpetuity/exclusions";

/// The request's one credential for `provider`: none is 401 (`missing` says what to send), two
/// different ones 400, each in the provider's shape.
pub(super) fn credential_of(
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
pub(super) struct ExclusionChange {
    #[serde(default)]
    rows: Vec<u64>,
    conversation: Option<String>,
    #[serde(default = "yes")]
    excluded: bool,
}

pub(super) fn yes() -> bool {
    true
}

/// The most row ids one change names (a whole conversation is named by `conversation`).
pub const MAX_EXCLUSION_ROWS: usize = 10_000;

impl ExclusionChange {
    /// Why the change is refused, if it is: more than [`MAX_EXCLUSION_ROWS`] ids.
    pub(super) fn refused(&self) -> Option<String> {
        (self.rows.len() > MAX_EXCLUSION_ROWS).then(|| {
            format!(
                "\"rows\" names {} ids; at most {MAX_EXCLUSION_ROWS} at once (a whole conversation: \"conversation\")",
                self.rows.len()
            )
        })
    }
}

/// `GET` or `POST` [`EXCLUSIONS_PATH`]: the asking user's exclusions (`docs/proxy.md`). The user
/// is the request's credential, narrowed by `x-perpetuity-user`, as for a chat request; errors
/// come in the shape of the provider the credential's header names.
pub(super) async fn exclusions(
    req: Request<Incoming>,
    state: Arc<State>,
) -> Result<Response<Body>, Refusal> {
    let (parts, body) = req.into_parts();
    let provider = Provider::from_headers(&parts.headers).unwrap_or(Provider::OpenAi);
    let invalid = |reason: &str| Refusal::new(provider, Failure::InvalidRequest, reason);
    let credential = credential_of(
        provider,
        &parts,
        "no API key: exclusions belong to the credential's memory (send it as for a chat request)",
    )?;
    let narrow = utf8_header(&parts.headers, USER_HEADER)
        .map_err(|reason| invalid(&reason))?
        .map(str::to_owned);
    let change = if parts.method == Method::POST {
        let bytes = request_body(body, &state.config, SIDE_BODY_LIMIT, provider).await?;
        let change = serde_json::from_slice::<ExclusionChange>(&bytes).map_err(|err| {
            invalid(&format!(
                "the body must be {{\"rows\": [ids], \"conversation\": \"name\", \"excluded\": true|false}}: {err}"
            ))
        })?;
        if let Some(reason) = change.refused() {
            return Err(invalid(&reason));
        }
        Some(change)
    } else {
        None
    };
    if !state.vouched(&credential) {
        return Err(Refusal::new(provider, Failure::Forbidden, UNVOUCHED));
    }
    let user = UserId::from_key(&state.secret.user_key(&credential, narrow.as_deref()));
    let Some(slot) = state.side_slot() else {
        return Err(Refusal::new(provider, Failure::Overloaded, SIDE_BUSY));
    };
    let done = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        change_exclusions(&state, user, change)
    })
    .await;
    Ok(match done {
        Ok(Ok(body)) => json(StatusCode::OK, &body),
        Ok(Err(err)) => {
            tracing::error!(%err, "exclusions failed");
            failure(provider, Failure::Overloaded, MEMORY_FAILED)
        }
        Err(err) => {
            tracing::error!(%err, "the exclusions task failed");
            failure(provider, Failure::Overloaded, MEMORY_FAILED)
        }
    })
}

/// Apply `change` (if any) to `user`'s exclusions; the rows it changed and every row now
/// excluded, in id order. The credential's endpoint and the inspector both call it.
pub(super) fn change_exclusions(
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
pub(super) fn utf8_header<'a>(
    headers: &'a HeaderMap,
    name: &str,
) -> Result<Option<&'a str>, String> {
    if headers.get_all(name).iter().nth(1).is_some() {
        return Err(format!("the {name} header is repeated: send it once"));
    }
    headers
        .get(name)
        .map(|value| {
            std::str::from_utf8(value.as_bytes())
                .map_err(|_| format!("the {name} header is not UTF-8 text"))
        })
        .transpose()
}
