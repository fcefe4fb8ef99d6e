//! Forwarding to the provider: the pass-through routes, the request's body read within its
//! limits, headers a proxy must not relay, and errors in the provider's shape.

use super::*;

/// Any other route: forwarded untouched to the provider the credential names (Gemini also by
/// a preview version's path), and its answer streamed back.
pub(super) async fn pass_through(
    req: Request<Incoming>,
    state: Arc<State>,
) -> Result<Response<Body>, Refusal> {
    let (parts, body) = req.into_parts();
    let preview = format::GEMINI_VERSIONS[1..]
        .iter()
        .any(|version| parts.uri.path().starts_with(version));
    let provider = if preview {
        Some(Provider::Gemini)
    } else {
        Provider::from_headers(&parts.headers)
    };
    let provider = provider.ok_or_else(|| {
        Refusal::new(
            Provider::OpenAi,
            Failure::InvalidRequest,
            &format!(
                "cannot tell which provider {} {} is for: send the provider's credential header",
                parts.method,
                parts.uri.path()
            ),
        )
    })?;
    let bytes = request_body(body, &state.config, state.config.body_limit, provider).await?;
    let permit = admit(&state, provider)?;
    let upstream = forward(&state, provider, &parts, bytes)
        .await
        .map_err(|(failed, message)| Refusal::new(provider, failed, &message))?;
    // The provider's word on the credential counts on every route.
    if let Ok(credential) = credential_of(provider, &parts, "") {
        let user = UserId::from_key(&state.secret.user_key(&credential, None));
        state.verdicts.answered(user, upstream.status());
    }
    Ok(answer(
        upstream,
        HeaderMap::new(),
        provider,
        None,
        None,
        &state.config,
        Some(permit),
    )
    .await)
}

/// Send the request to `provider`'s upstream with `body`: same method, path, query and headers
/// (minus hop-by-hop ones and our own), identity encoding so the stream can be read.
pub(super) async fn forward(
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

/// A client's request body within `limit` bytes, the idle timeout and the body deadline, or the
/// error to answer in `provider`'s shape (413 over the limit, 400 when it stalls, breaks off or
/// runs past the deadline).
pub(super) async fn request_body(
    body: Incoming,
    config: &ProxyConfig,
    limit: usize,
    provider: Provider,
) -> Result<Bytes, Refusal> {
    let read = read_body(body, limit, config.header_timeout, Failure::InvalidRequest);
    match tokio::time::timeout(config.body_timeout, read).await {
        Ok(read) => read.map_err(|(failed, message)| Refusal::new(provider, failed, &message)),
        Err(_) => Err(Refusal::new(
            provider,
            Failure::InvalidRequest,
            &format!(
                "the request body took longer than {:?} to arrive",
                config.body_timeout
            ),
        )),
    }
}

/// Read a whole body, refusing more than `limit` bytes, and giving up when nothing arrives for
/// `idle` (`stalled` is the failure then: the client's or the upstream's), so a sender that
/// stops midway holds no connection, permit or buffer for longer than that.
pub(super) async fn read_body<B>(
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
pub(super) fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// Tell proxies in front of us not to buffer or cache a relayed event stream.
pub(super) fn relay_unbuffered(headers: &mut HeaderMap) {
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
pub(super) fn strip_upstream_headers(headers: &mut HeaderMap) {
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
pub(super) fn failure(provider: Provider, failed: Failure, message: &str) -> Response<Body> {
    let mut response = json(failed.status(), &provider.error_body(failed, message));
    let kind = match failed {
        Failure::Upstream | Failure::Timeout => "upstream",
        Failure::InvalidRequest
        | Failure::Authentication
        | Failure::Forbidden
        | Failure::TooLarge
        | Failure::Overloaded => "refused",
    };
    response
        .headers_mut()
        .insert(PROXY_ERROR, HeaderValue::from_static(kind));
    response
}

pub(super) fn json(status: StatusCode, body: &serde_json::Value) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// A streamed body fed by the relay task.
pub(super) struct Channel(pub(super) mpsc::Receiver<Bytes>);

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
