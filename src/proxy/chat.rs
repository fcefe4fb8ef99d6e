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
    /// The credential's own user (the asker, or the user it narrows), whose verdict the
    /// provider gives ([`super::verdict`]).
    pub(super) fn credential(&self) -> UserId {
        self.owner
            .unwrap_or_else(|| UserId::from_key(&self.user_key))
    }

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

/// A chat request through the pipeline (`docs/proxy.md`, "The pipeline"), stage by stage:
/// admitted, read as the harness sent it and its asker identified, remembered (its turn
/// captured, its history read against the memory, its frame recalled), framed, forwarded, and
/// answered (the reply relayed and captured).
pub(super) async fn chat(
    req: Request<Incoming>,
    state: Arc<State>,
    format: wire::Format,
) -> Result<Response<Body>, Refusal> {
    let started = std::time::Instant::now();
    let (parts, body) = req.into_parts();
    // The body is read whole (within its deadline) before the request takes a slot.
    let asked = read(&state, format, &parts, body).await?;
    let permit = admit(&state, format.provider())?;
    let mut remembered = remember_asked(&state, &parts, asked).await;
    state.metrics.memory_time(started.elapsed());
    let framed = frame(&state, &mut remembered)?;
    let forwarded = forward_framed(&state, &parts, &mut remembered, &framed).await;
    answer_asked(
        &state, parts, remembered, framed, forwarded, started, permit,
    )
    .await
}

/// A chat request as its harness sent it, with who asks and what the proxy may do with it.
struct Asked {
    format: wire::Format,
    /// The body as it is forwarded when the proxy changes nothing of it.
    bytes: Bytes,
    /// Shared with the blocking memory task, not copied: a body's parsed tree is many times
    /// its size.
    request: Arc<wire::Request>,
    switches: Switches,
    identity: Identity,
    /// The conversation a header or the harness named, if any.
    named: Option<String>,
}

/// Read the request as its harness sent it and identify who asks: the credential, the body
/// parsed ([`wire::parse`]), the harness's session and side calls ([`harness`]), the user,
/// its scope and the conversation as named.
async fn read(
    state: &State,
    format: wire::Format,
    parts: &hyper::http::request::Parts,
    body: Incoming,
) -> Result<Asked, Refusal> {
    let provider = format.provider();
    let credential = credential_of(
        provider,
        parts,
        "no API key: send the provider's credential (Authorization: Bearer; x-api-key for Anthropic; x-goog-api-key or ?key= for Gemini)",
    )?;
    if provider == Provider::Anthropic && !parts.headers.contains_key("anthropic-version") {
        return Err(Refusal::new(
            provider,
            Failure::InvalidRequest,
            "the anthropic-version header is required",
        ));
    }
    let bytes = request_body(body, &state.config, state.config.body_limit, provider).await?;
    let path_model = format
        .wire()
        .path_model(parts.uri.path())
        .map(str::to_owned);
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
    let mut switches = Switches::from(&parts.headers);
    // Gemini does not call functions in JSON mode: the memory tools stay out of such a turn.
    if provider == Provider::Gemini && harness::asks_structured_output(&request.body) {
        switches.tools = false;
    }
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
    let identity = Identity {
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
        .and_then(|id| state.continued.resolve(user, id))
    {
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
    Ok(Asked {
        format,
        bytes,
        request,
        switches,
        identity,
        named,
    })
}

/// What the memory made of a request: the request (its identity now naming the conversation
/// it continues), what remembering did (`None` when the memory was not ready), the serving
/// dictionary's version, and the upstream's answer when the request was forwarded while it
/// was remembered.
struct Remembering {
    asked: Asked,
    remembered: Option<Result<Remembered, tokio::task::JoinError>>,
    dictionary: String,
    forwarded: Option<Forwarded>,
}

/// The upstream's answer, or why there is none.
type Forwarded = Result<Response<Incoming>, (Failure, String)>;

/// Remember the request in the blocking pool ([`remember`]): its history read against the
/// memory, its new turn captured, its frame recalled. Not ready (the storage failed and its
/// probe has not yet written again): nothing is captured and the request goes through
/// untouched. A new turn without recall is forwarded as it came meanwhile, so its question is
/// captured while it is on its way; only a question that may be too long to store (each of
/// its chunks holds a byte at least) is captured first, to be refused before anything is
/// forwarded.
async fn remember_asked(
    state: &Arc<State>,
    parts: &hyper::http::request::Parts,
    mut asked: Asked,
) -> Remembering {
    let remembering = state.health.ready().then(|| {
        let (state, request, identity, named, switches) = (
            Arc::clone(state),
            Arc::clone(&asked.request),
            asked.identity.clone(),
            asked.named.clone(),
            asked.switches,
        );
        tokio::task::spawn_blocking(move || remember(&state, &request, &identity, named, switches))
    });
    let remembered = async {
        match remembering {
            Some(task) => Some(task.await),
            None => None,
        }
    };
    let request = &asked.request;
    let (remembered, forwarded) = if !asked.switches.recall
        && request.question_is_new()
        && request.question.as_ref().map_or(0, String::len) <= MAX_CHUNKS
    {
        let provider = asked.format.provider();
        let (remembered, forwarded) = tokio::join!(
            remembered,
            forward(state, provider, parts, asked.bytes.clone())
        );
        (remembered, Some(forwarded))
    } else {
        (remembered.await, None)
    };
    let serving = || {
        let generation = state.engine.generation();
        generation.memory.dictionary.version().to_owned()
    };
    let (remembered, dictionary) = match remembered {
        Some(Ok((remembered, dictionary))) => {
            asked
                .identity
                .conversation
                .clone_from(&remembered.history.conversation);
            (Some(Ok(remembered)), dictionary)
        }
        Some(Err(err)) => (Some(Err(err)), serving()),
        None => (None, serving()),
    };
    Remembering {
        asked,
        remembered,
        dictionary,
        forwarded,
    }
}

/// The body the proxy forwards and what it knows of it.
struct Framed {
    outbound: Bytes,
    /// `x-perpetuity-memory`: `ok`, `off` or `unavailable`.
    memory: &'static str,
    turn: Option<Arc<TurnFrame>>,
    recall: Option<Recall>,
    /// The body with the memory tools offered, which a memory round continues from.
    tool_base: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Write the frame into the request ([`wire::framed`]: the part of its history the memory
/// holds replaced, the rest kept where it stood) and offer the memory tools; the request as it
/// came when there is no frame. A question too long to store is refused here.
fn frame(state: &State, remembering: &mut Remembering) -> Result<Framed, Refusal> {
    let Remembering {
        asked:
            Asked {
                format,
                bytes,
                request,
                switches,
                ..
            },
        remembered,
        ..
    } = remembering;
    let untouched = |memory| Framed {
        outbound: bytes.clone(),
        memory,
        turn: None,
        recall: None,
        tool_base: None,
    };
    let remembered = match remembered {
        Some(Ok(remembered)) => remembered,
        Some(Err(err)) => {
            tracing::error!(%err, "memory task failed; forwarding the request untouched");
            state.metrics.count(metrics::Event::MemoryUnavailable);
            return Ok(untouched("unavailable"));
        }
        None => {
            state.metrics.count(metrics::Event::MemoryUnavailable);
            return Ok(untouched("unavailable"));
        }
    };
    let recalled = match &mut remembered.recall {
        Ok(Some(recalled)) => recalled,
        Ok(None) => return Ok(untouched("off")),
        Err(err @ Error::Store(StoreError::TooLong { .. })) => {
            return Err(Refusal::new(
                format.provider(),
                Failure::TooLarge,
                &err.to_string(),
            ));
        }
        Err(err) => {
            tracing::error!(%err, "memory unavailable; forwarding the request untouched");
            state.health.report("remembering a request", err);
            state.metrics.count(metrics::Event::MemoryUnavailable);
            return Ok(untouched("unavailable"));
        }
    };
    if let Some((rows, us)) = recalled.scanned {
        state.metrics.scanned(rows, Duration::from_micros(us));
    }
    let tools = switches.tools(&state.config);
    let wire::Framed { mut body, verbatim } =
        wire::framed(request, &recalled.turn.items, &remembered.history.context);
    if tools {
        rounds::offer(*format, &mut body);
    }
    let owned: &[&str] = if tools {
        &[format.list(), "tools"]
    } else {
        &[format.list()]
    };
    let outbound = Bytes::from(wire::encode(request, &body, Some(&verbatim), owned));
    Ok(Framed {
        outbound,
        memory: "ok",
        turn: Some(Arc::clone(&recalled.turn)),
        recall: recalled.recall.take(),
        tool_base: tools.then_some(body),
    })
}

/// What forwarding did: the upstream's answer, whether the question is stored, and the
/// memory's state as the response reports it.
struct Sent {
    upstream: Forwarded,
    question_stored: bool,
    /// The question's rows when it was stored after the provider's success: the frame showed
    /// it, so the memory tools pass over them as over the frame's rows.
    question_rows: Vec<RowId>,
    memory: &'static str,
}

/// Forward the framed request (unless it went while it was remembered), note the provider's
/// verdict on the credential ([`super::verdict`]), then write what waited for it: only on a
/// success (2xx); a refusal, an error status, a failed or silent upstream leave nothing.
async fn forward_framed(
    state: &Arc<State>,
    parts: &hyper::http::request::Parts,
    remembering: &mut Remembering,
    framed: &Framed,
) -> Sent {
    let provider = remembering.asked.format.provider();
    let upstream = match remembering.forwarded.take() {
        Some(upstream) => upstream,
        None => forward(state, provider, parts, framed.outbound.clone()).await,
    };
    let status = upstream.as_ref().ok().map(Response::status);
    if let Some(status) = status {
        state
            .verdicts
            .answered(remembering.asked.identity.credential(), status);
    }
    let mut sent = Sent {
        question_stored: matches!(&remembering.remembered, Some(Ok(r)) if r.question_stored),
        question_rows: Vec::new(),
        memory: framed.memory,
        upstream,
    };
    let deferred = match &mut remembering.remembered {
        Some(Ok(remembered)) => std::mem::take(&mut remembered.deferred),
        _ => return sent,
    };
    if deferred.messages.is_empty() {
        return sent;
    }
    if !status.is_some_and(|status| status.is_success()) {
        tracing::info!(status = ?status, "the provider did not accept a request whose credential it has not vouched for lately: nothing of it is stored");
        return sent;
    }
    let (waited, identity) = (Arc::clone(state), remembering.asked.identity.clone());
    match tokio::task::spawn_blocking(move || capture_deferred(&waited, &identity, deferred)).await
    {
        Ok(Ok(rows)) => {
            sent.question_stored = !rows.is_empty();
            sent.question_rows = rows;
        }
        Ok(Err(err)) => {
            tracing::error!(%err, "capturing what waited for the provider failed");
            state.health.report("capturing a request", &err);
            state.metrics.count(metrics::Event::MemoryUnavailable);
            sent.memory = "unavailable";
        }
        Err(err) => {
            tracing::error!(%err, "the capture task failed");
            state.metrics.count(metrics::Event::MemoryUnavailable);
            sent.memory = "unavailable";
        }
    }
    sent
}

/// Answer the client: the request logged for the inspector, the memory's headers, and the
/// upstream's reply relayed and captured ([`answer`]), through a memory round when the memory
/// tools rode along ([`rounds::answer_with_rounds`]); the upstream's failure in the provider's
/// shape.
async fn answer_asked(
    state: &Arc<State>,
    parts: hyper::http::request::Parts,
    remembering: Remembering,
    framed: Framed,
    sent: Sent,
    started: std::time::Instant,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> Result<Response<Body>, Refusal> {
    let Remembering {
        asked, dictionary, ..
    } = remembering;
    let Asked {
        format,
        request,
        switches,
        identity,
        ..
    } = asked;
    let provider = format.provider();
    // A request the provider refused the credential of leaves nothing, here as in the store.
    let refused = sent.upstream.as_ref().is_ok_and(|answer| {
        matches!(
            answer.status(),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
        )
    });
    let log = (state.recent.enabled() && !refused).then(|| {
        Arc::new(recent::Logged {
            id: state.recent.number(),
            user: UserId::from_key(&identity.user_key),
            scope: identity.scope.clone(),
            at_ms: now_ms(),
            format: format.name(),
            model: request.model.clone(),
            conversation: identity.conversation.clone(),
            question: request.question.clone(),
            memory: sent.memory,
            question_stored: sent.question_stored,
            forwarded: framed.outbound.clone(),
            reused: framed.turn.is_some() && framed.recall.is_none(),
            tools: framed.tool_base.is_some(),
            recall: framed.recall,
            after: Mutex::new(recent::After {
                status: sent.upstream.as_ref().ok().map(|r| r.status().as_u16()),
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
    let upstream = sent
        .upstream
        .map_err(|(failed, message)| Refusal::new(provider, failed, &message))?;
    state.metrics.first_byte(started.elapsed());
    let mut report = HeaderMap::new();
    report.insert("x-perpetuity-memory", HeaderValue::from_static(sent.memory));
    if let Ok(version) = HeaderValue::from_str(&dictionary) {
        report.insert("x-perpetuity-dictionary", version);
    }
    if sent.question_stored {
        acknowledge(&mut report, "question");
    }
    if let Some(turn) = &framed.turn {
        for (name, value) in [
            ("x-perpetuity-retrieved", turn.retrieved.len()),
            ("x-perpetuity-frame-tokens", turn.tokens),
            ("x-perpetuity-trimmed", turn.trimmed),
        ] {
            report.insert(name, HeaderValue::from(value));
        }
    }
    let reply = (sent.memory != "unavailable" && switches.writes()).then(|| Reply {
        state: Arc::clone(state),
        format,
        identity: identity.clone(),
        model: request.model.clone(),
        log: log.clone(),
    });
    if let (Some(base), Some(recalled)) = (framed.tool_base, &framed.turn) {
        let shown: Vec<RowId> = recalled
            .shown
            .iter()
            .chain(&sent.question_rows)
            .copied()
            .collect();
        let turn = crate::memory_tools::TurnState::new(
            UserId::from_key(&identity.user_key),
            &identity.scope,
            Some(now_ms()),
            recalled.retrieved.clone(),
            &shown,
        );
        let tool_loop = rounds::Loop {
            state: Arc::clone(state),
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
