//! One replay: every planned call sent in order through the real HTTP proxy, over a fresh
//! memory, to a scripted local upstream that answers each with its recorded answer and keeps
//! the body the proxy forwarded; each call measured as it comes back.

use std::sync::Arc;

use http_body_util::{BodyExt as _, Full};
use hyper::Request;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::Value;
use tokio::net::TcpListener;

use super::baselines::{bytes_of, clear, list_bytes, truncate};
use super::plan::{ItemsText, Plan};
use super::terms::text_of;
use super::transcript::{Harness, Session};
use super::{Progress, ReplayError, Setup, request};
use crate::engine::Engine;
use crate::eval::{ScratchDir, Throttle};
use crate::memory::Memory;
use crate::proxy::prefix::{common_prefix, input_of};
use crate::proxy::{self, ProxyConfig, State};
use crate::store::{Store, StoreOptions};

/// The one credential every replayed session is sent under, so they share one memory.
pub const CREDENTIAL: &str = "replay-credential";

/// Of one class of an answer's terms: how many, and how many of them each way of sending held
/// in its conversation.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Found {
    pub terms: usize,
    pub proxy: usize,
    pub truncation: usize,
    pub clearing: usize,
}

/// What one call measured at one setting.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Measured {
    pub harness: Harness,
    /// Its session (index into the replayed sessions, in time order) and call in it.
    pub session: usize,
    pub call: usize,
    /// Whether it opens its turn (else it is a tool step of the turn before it).
    pub opens_turn: bool,
    /// Whether it is its session's first call (no request before it to share a prefix with).
    pub first: bool,
    /// The answer's terms in the current turn, only in earlier turns, only in earlier sessions.
    pub current: Found,
    pub earlier: Found,
    pub cross: Found,
    /// Bytes of the conversation (`messages`, `input`) the harness sent and the proxy forwarded.
    pub direct_bytes: usize,
    pub forwarded_bytes: usize,
    /// Bytes of the live turn and its tool round as the harness sent them: what the proxy
    /// forwards whole whatever it frames.
    pub turn_bytes: usize,
    /// Bytes of the input in the provider's prompt order (tools, system, conversation), and of
    /// its start that the session's previous request shares.
    pub direct_input: usize,
    pub forwarded_input: usize,
    pub direct_cached: usize,
    pub forwarded_cached: usize,
    /// The live prompt's length in characters and whether it arrived whole.
    pub prompt: Option<(usize, bool)>,
}

/// One replay's measurements, and the calls the proxy did not forward (with the first one's
/// status and answer).
#[derive(Debug, Clone, Default)]
pub struct Replayed {
    pub measured: Vec<Measured>,
    pub failed: usize,
    pub first_failure: Option<String>,
}

/// Replay every call of `plans` through a proxy whose recall keeps `session_tokens` of the
/// current conversation, over a fresh memory in a scratch folder.
pub fn replay(
    sessions: &[Session],
    plans: &[Plan],
    setup: &Setup,
    session_tokens: usize,
    progress: &mut dyn FnMut(Progress),
) -> Result<Replayed, ReplayError> {
    // Declared before the memory, so the store is closed before its folder is removed.
    let scratch = ScratchDir::new(&format!("replay-{session_tokens}"))?;
    let store = Store::open(scratch.path(), &StoreOptions::default())?;
    store.bind_dictionary(setup.dictionary.version())?;
    let memory = Memory {
        store: Arc::new(store),
        dictionary: Arc::clone(&setup.dictionary),
    };
    let (engine, _, _) = Engine::open(memory, setup.kernels)?;
    let secret = proxy::identity::Secret::load_or_create(scratch.path())?;
    let runtime = tokio::runtime::Runtime::new()?;
    let replayed = runtime.block_on(async {
        let script = Arc::new(Mutex::new(std::collections::VecDeque::new()));
        let record = Arc::new(Mutex::new(Vec::new()));
        let upstream =
            proxy::load::scripted_upstream(Arc::clone(&script), Arc::clone(&record)).await?;
        let mut config = ProxyConfig {
            anthropic: format!("http://{upstream}"),
            openai: format!("http://{upstream}"),
            ..ProxyConfig::default()
        };
        config.recall.session_tokens = session_tokens;
        let state = Arc::new(State::new(engine, secret, config));
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        tokio::spawn(proxy::serve(listener, state));
        let client: Client<HttpConnector, Full<Bytes>> =
            Client::builder(TokioExecutor::new()).build_http();
        let mut out = Replayed::default();
        let mut throttle = Throttle::default();
        let mut at = 0;
        for (s, session) in sessions.iter().enumerate() {
            let texts = ItemsText::new(&session.items);
            let sizes: Vec<usize> = session.items.iter().map(bytes_of).collect();
            let mut previous: Option<(Vec<u8>, Vec<u8>)> = None;
            while let Some(plan) = plans.get(at).filter(|p| p.session == s) {
                at += 1;
                let call = &session.calls[plan.call];
                let (path, headers, body) = request::direct(session, call);
                script
                    .lock()
                    .push_back(Bytes::from(request::answer_stream(session, call, at)));
                let mut builder = Request::post(format!("http://{address}{path}"))
                    .header("content-type", "application/json");
                builder = match session.harness {
                    Harness::ClaudeCode => builder.header("x-api-key", CREDENTIAL),
                    Harness::Codex => {
                        builder.header("authorization", format!("Bearer {CREDENTIAL}"))
                    }
                };
                for (name, value) in headers {
                    builder = builder.header(name, value);
                }
                let request = builder
                    .body(Full::new(Bytes::from(body.to_string())))
                    .map_err(|e| ReplayError::Proxy(e.to_string()))?;
                let response = client
                    .request(request)
                    .await
                    .map_err(|e| ReplayError::Proxy(e.to_string()))?;
                let status = response.status();
                let answer = response
                    .into_body()
                    .collect()
                    .await
                    .map_err(|e| ReplayError::Proxy(e.to_string()))?
                    .to_bytes();
                let forwarded = {
                    let mut record = record.lock();
                    let newest = record.pop();
                    record.clear();
                    newest
                };
                // An answer the proxy did not ask for must not answer the next call.
                script.lock().clear();
                let Some(forwarded) = forwarded.filter(|_| status.is_success()) else {
                    out.failed += 1;
                    out.first_failure.get_or_insert_with(|| {
                        format!(
                            "{}: call {} answered {status}: {}",
                            session.path.display(),
                            plan.call,
                            String::from_utf8_lossy(&answer[..answer.len().min(300)])
                        )
                    });
                    continue;
                };
                let forwarded: Value = serde_json::from_slice(&forwarded).unwrap_or(Value::Null);
                let inputs = (input_of(&body), input_of(&forwarded));
                let mut measured = measure(
                    session,
                    plan,
                    (&texts, &sizes),
                    &forwarded,
                    (inputs.0.len(), inputs.1.len()),
                );
                if let Some((direct, through)) = &previous {
                    measured.direct_cached = common_prefix(direct, &inputs.0);
                    measured.forwarded_cached = common_prefix(through, &inputs.1);
                }
                previous = Some(inputs);
                out.measured.push(measured);
                if throttle.due(at == plans.len()) {
                    progress(Progress::Calls {
                        session_tokens,
                        sessions: (s + 1, sessions.len()),
                        calls: (at, plans.len()),
                    });
                }
            }
        }
        Ok::<_, ReplayError>(out)
    })?;
    drop(runtime);
    Ok(replayed)
}

/// Measure one call: the answer's terms found in the forwarded conversation and in the two
/// baselines cut to its size, the sizes, and whether the live prompt arrived whole. The
/// session's `texts` and item `sizes` are read for the harness's own history.
pub(super) fn measure(
    session: &Session,
    plan: &Plan,
    (texts, sizes): (&ItemsText, &[usize]),
    forwarded: &Value,
    (direct_input, forwarded_input): (usize, usize),
) -> Measured {
    let call = &session.calls[plan.call];
    let conversation = &forwarded[session.harness.format().list()];
    let forwarded_text = text_of(conversation);
    let forwarded_bytes = bytes_of(conversation);
    let history = &session.items[call.from..call.at];
    let sizes = &sizes[call.from..call.at];
    let keep = plan.live.unwrap_or(history.len().saturating_sub(1));
    let kept_from = truncate(sizes, keep, forwarded_bytes);
    let truncated = texts.of(call.from + kept_from, call.at);
    let (cleared, _) = clear(history, sizes, keep, forwarded_bytes);
    let cleared = text_of(&Value::Array(cleared));
    let found = |terms: &[String]| {
        let count = |text: &str| terms.iter().filter(|t| text.contains(t.as_str())).count();
        Found {
            terms: terms.len(),
            proxy: count(&forwarded_text),
            truncation: count(truncated),
            clearing: count(&cleared),
        }
    };
    Measured {
        harness: session.harness,
        session: plan.session,
        call: plan.call,
        opens_turn: plan.opens_turn,
        first: plan.call == 0,
        current: found(&plan.terms.current),
        earlier: found(&plan.terms.earlier),
        cross: found(&plan.terms.cross),
        direct_bytes: list_bytes(sizes),
        forwarded_bytes,
        turn_bytes: list_bytes(&sizes[keep.min(sizes.len())..]),
        direct_input,
        forwarded_input,
        direct_cached: 0,
        forwarded_cached: 0,
        prompt: plan
            .prompt
            .as_ref()
            .map(|p| (p.chars().count(), forwarded_text.contains(p.as_str()))),
    }
}
