//! The upstream's reply: relayed to the client as it arrives, read for the reply text, and the
//! reply captured at its end.

use super::*;

/// Where a finished reply is captured.
pub(super) struct Reply {
    pub(super) state: Arc<State>,
    pub(super) format: wire::Format,
    pub(super) identity: Identity,
    pub(super) model: String,
    /// The request's entry in the inspector's log.
    pub(super) log: Option<Arc<recent::Logged>>,
}

impl Reply {
    /// Store the reply's text as the assistant's turn (marked when the stream was cut short);
    /// whether it was committed.
    pub(super) fn capture(self, text: String, complete: bool) -> bool {
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
pub(super) fn acknowledge(headers: &mut HeaderMap, what: &str) {
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
pub(super) async fn answer(
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
/// event with a blank line if the upstream did not; capture the reply, then end the stream. A
/// client that goes away, or an upstream silent for `idle`, stops the relay, which drops
/// (cancels) the upstream request; what was received is captured, marked truncated.
pub(super) async fn relay(
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
    // The stream ends for the client once its reply is stored, as a whole reply is answered
    // once stored: a client that has the whole reply finds it in the memory of its next
    // request.
    if let (Some(reply), Some(reader)) = (reply, reader) {
        let (text, complete) = reader.finish();
        let _ = tokio::task::spawn_blocking(move || reply.capture(text, complete)).await;
    }
    drop(tx);
}
