//! The chat pipeline: a chat request's switches and identity, admitted, its turn captured and
//! its memory recalled, rewritten with the frame, forwarded and its reply relayed and captured;
//! a refusal is already the client's error response.

use super::*;

/// The per-request switches (headers; `docs/proxy.md`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Switches {
    pub(super) capture: bool,
    pub(super) recall: bool,
    pub(super) probe: bool,
    pub(super) tools: bool,
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
    pub(super) fn writes(self) -> bool {
        self.capture && !self.probe
    }

    /// Whether the memory tools ride along with a request (with its frame): every format
    /// carries them.
    pub(super) fn tools(self, config: &ProxyConfig) -> bool {
        self.tools && config.tools && config.tool_rounds > 1
    }
}

/// Who is asking, in which conversation, and whose rows its search reads.
#[derive(Debug, Clone)]
pub(super) struct Identity {
    pub(super) user_key: String,
    pub(super) conversation: String,
    /// The asker's user id, then its group scope's other members' ([`Groups::scope`]).
    pub(super) scope: Vec<UserId>,
    /// The store's purge epoch when the request arrived: what it captures after a purge of
    /// the asker is dropped.
    pub(super) since: u64,
    /// The credential's own user when `x-perpetuity-user` narrows it: the sub-user is linked
    /// to it before it is first written, so a purge of the credential finds it.
    pub(super) owner: Option<UserId>,
}

impl Identity {
    /// Whom this request's captures belong to.
    pub(super) fn author(&self) -> Author<'_> {
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
pub(super) fn admit(
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
pub(super) struct Refusal(Box<Response<Body>>);

impl Refusal {
    /// `failed`, saying `message`, in `provider`'s shape ([`failure`]).
    pub(super) fn new(provider: Provider, failed: Failure, message: &str) -> Self {
        Self(Box::new(failure(provider, failed, message)))
    }
}

impl From<Refusal> for Response<Body> {
    fn from(refusal: Refusal) -> Self {
        *refusal.0
    }
}

/// A chat request through the pipeline.
pub(super) async fn chat(
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
    let path_model = format
        .wire()
        .path_model(parts.uri.path())
        .map(str::to_owned);
    // Shared with the blocking memory task, not copied: a body's parsed tree is many times its
    // size.
    let invalid = |reason: String| Refusal::new(provider, Failure::InvalidRequest, &reason);
    let request = Arc::new(wire::parse(format, &bytes, path_model.as_deref()).map_err(invalid)?);
    let narrow = utf8_header(&parts.headers, USER_HEADER).map_err(invalid)?;
    let conversation = utf8_header(&parts.headers, CONVERSATION_HEADER).map_err(invalid)?;
    let session = harness::session(format, &request.body, &parts.headers);
    let named = conversation.map(str::to_owned).or_else(|| session.clone());
    let user_key = state.secret.user_key(&credential, narrow);
    let user = UserId::from_key(&user_key);
    let session_offers_tools = session
        .as_deref()
        .is_some_and(|session| state.held.offers_tools(user, session));
    let switches = Switches::from(&parts.headers);
    let switches = if harness::is_side_call(
        &request.body,
        &request.messages,
        &parts.headers,
        session_offers_tools,
    ) {
        switches.side_call()
    } else {
        if let Some(session) = session
            .as_deref()
            .filter(|_| harness::offers_tools(&request.body))
        {
            state.held.note_tools(user, session);
        }
        switches
    };
    let mut identity = Identity {
        user_key,
        scope: state
            .config
            .groups
            .scope(&state.secret, &credential, narrow)
            .iter()
            .map(|key| UserId::from_key(key))
            .collect(),
        owner: narrow.map(|_| UserId::from_key(&state.secret.user_key(&credential, None))),
        conversation: named
            .clone()
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
    let remembering = state.health.ready().then(|| {
        let (state, request, identity) =
            (Arc::clone(&state), Arc::clone(&request), identity.clone());
        tokio::task::spawn_blocking(move || remember(&state, &request, &identity, named, switches))
    });
    let remembered = async {
        match remembering {
            Some(task) => Some(task.await),
            None => None,
        }
    };
    // A new turn without recall is forwarded as it came, so its question is captured while
    // it is on its way; only a question that may be too long to store (each of its chunks
    // holds a byte at least) is captured first, to be refused before anything is forwarded.
    let (remembered, forwarded) = if !switches.recall
        && request.question_is_new()
        && request.question.as_ref().map_or(0, String::len) <= MAX_CHUNKS
    {
        let (remembered, forwarded) =
            tokio::join!(remembered, forward(&state, provider, &parts, bytes.clone()));
        (remembered, Some(forwarded))
    } else {
        (remembered.await, None)
    };
    let serving = || {
        let generation = state.engine.generation();
        generation.memory.dictionary.version().to_owned()
    };
    let mut context = Vec::new();
    if let Some(Ok((remembered, _))) = &remembered {
        identity
            .conversation
            .clone_from(&remembered.history.conversation);
        context.clone_from(&remembered.history.context);
    }
    let (mut remembered, dictionary) = match remembered {
        Some(Ok((remembered, dictionary))) => (Some(Ok(remembered)), dictionary),
        Some(Err(err)) => (Some(Err(err)), serving()),
        None => (None, serving()),
    };
    state.metrics.memory_time(started.elapsed());
    let mut question_stored = matches!(&remembered, Some(Ok(r)) if r.question_stored);
    let deferred = match &mut remembered {
        Some(Ok(remembered)) => std::mem::take(&mut remembered.deferred),
        _ => Deferred::default(),
    };
    let tools = switches.tools(&state.config);
    let mut tool_base = None;
    let (outbound, mut memory_status, turn, recall) = match remembered.map(|r| r.map(|r| r.recall))
    {
        Some(Ok(Ok(Some(recalled)))) => {
            if let Some((rows, us)) = recalled.scanned {
                state.metrics.scanned(rows, Duration::from_micros(us));
            }
            let wire::Framed { mut body, verbatim } =
                wire::framed(&request, &recalled.turn.items, &context);
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

    let upstream = match forwarded {
        Some(upstream) => upstream,
        None => forward(&state, provider, &parts, outbound.clone()).await,
    };
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
