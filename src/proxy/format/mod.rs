//! One module per chat wire format, each behind [`WireFormat`]: what the pipeline (`wire`,
//! `sse`) and the memory tools' loop (`rounds`) need to know of a format, and nothing they
//! share. A new format is one more module here and its line in the registry (`formats!`): the
//! route that serves it and its metrics label come from its [`WireFormat`].

use hyper::body::Bytes;
use serde_json::{Map, Value, json};

use crate::frame::Side;
use crate::memory_tools;

use super::harness::Kind;
use super::provider::Provider;
use super::rounds::{Round, SpliceState};
use super::sse::{self, StreamReader};
use super::wire::{self, Call, Outcome, Request};

/// The registry: each line a format's module, the type there that implements [`WireFormat`],
/// and its variant of [`Format`]. A new format is a new module and one line here.
macro_rules! formats {
    ($($module:ident::$speaker:ident => $variant:ident),+ $(,)?) => {
        $(mod $module;)+

        /// A chat API's wire format (each described in its module).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Format {
            $($variant),+
        }

        impl Format {
            /// Every format, in the registry's order.
            pub const ALL: &[Format] = &[$(Format::$variant),+];

            /// The implementation that speaks this format.
            pub(super) fn wire(self) -> &'static dyn WireFormat {
                match self {
                    $(Self::$variant => &$module::$speaker),+
                }
            }
        }
    };
}

formats! {
    chat::Chat => Chat,
    responses::Responses => Responses,
    messages::Messages => Messages,
    gemini::Gemini => Gemini,
}

pub(super) use gemini::GEMINI_VERSIONS;

impl Format {
    /// The format served at `path` (a POST there is a chat request), if any.
    pub(super) fn at(path: &str) -> Option<Self> {
        Self::ALL
            .iter()
            .copied()
            .find(|format| format.wire().serves(path))
    }

    /// The provider whose API this is.
    pub fn provider(self) -> Provider {
        self.wire().provider()
    }

    /// The API's name as the inspector shows it.
    pub fn name(self) -> &'static str {
        self.wire().name()
    }

    /// The body field holding the conversation.
    pub fn list(self) -> &'static str {
        self.wire().list()
    }
}

/// What of one upstream stream event reaches the client, as a format's splice decides it.
#[derive(Debug)]
pub(super) enum Event {
    /// Nothing: the event belongs to our calls, or to a round whose end is held back.
    Hold,
    /// The event as it came, byte for byte.
    Pass,
    /// These bytes instead: the event renumbered, re-identified or with our calls taken out.
    Rewrite(Vec<u8>),
}

impl Event {
    /// `event` re-encoded in `format` when the splice `changed` it, else as it came.
    fn changed(changed: bool, format: Format, event: &Map<String, Value>) -> Self {
        if changed {
            Self::Rewrite(sse::encode_event(format, event))
        } else {
            Self::Pass
        }
    }
}

/// Everything that differs between the chat wire formats: reading a request, writing the frame
/// into it, reading and writing its stream's events, and splicing the memory tools' rounds into
/// its reply. Defaults are what most formats do; a format overrides where it differs.
pub(super) trait WireFormat: Sync {
    /// The provider whose API this is.
    fn provider(&self) -> Provider;

    /// The API's name as the inspector shows it.
    fn name(&self) -> &'static str;

    /// The route's label in the metrics.
    fn metric(&self) -> &'static str;

    /// Whether a POST to `path` is a chat request in this format.
    fn serves(&self, path: &str) -> bool;

    /// The model `path` names, where the format puts it in the path.
    fn path_model<'p>(&self, _path: &'p str) -> Option<&'p str> {
        None
    }

    /// The body field holding the conversation.
    fn list(&self) -> &'static str {
        "messages"
    }

    /// The conversation's items, taken out of `body` (the list left empty); the message says
    /// what is wrong.
    fn take_items(&self, body: &mut Map<String, Value>) -> Result<Vec<Value>, String> {
        match body.get_mut(self.list()) {
            Some(Value::Array(items)) => Ok(std::mem::take(items)),
            _ => Err(format!("`{}` must be an array", self.list())),
        }
    }

    /// Checks of the body's other fields, after its items were read.
    fn check(&self, _body: &Map<String, Value>) -> Result<(), String> {
        Ok(())
    }

    /// Whether a conversation item must carry a `role` string.
    fn needs_role(&self, _item: &Value) -> bool {
        true
    }

    /// What an item of the conversation is.
    fn kind_of(&self, item: &Value) -> Kind {
        wire::kind_by_role(item)
    }

    /// Whether the provider keeps this conversation's history itself, so the frame cannot
    /// replace it.
    fn server_history(&self, _body: &Map<String, Value>) -> bool {
        false
    }

    /// The conversation's session id as the harness writes it into the body, if it does.
    fn session(&self, _body: &Map<String, Value>) -> Option<String> {
        None
    }

    /// One message of the frame (or a withdrawn tool round's plain text) as a conversation item.
    fn frame_item(&self, side: Side, text: &str) -> Value {
        json!({
            "role": match side {
                Side::User => "user",
                Side::Assistant => "assistant",
            },
            "content": text,
        })
    }

    /// Mark the frame's end for the provider's prompt cache where the client marked the
    /// history the frame replaces (`kept`: the items before the live turn `live`).
    fn mark_frame_end(&self, _request: &Request, _kept: &[Value], _live: &mut Value) {}

    /// The calls in one item of the agent's.
    fn calls_in(&self, item: &Value) -> Vec<Call>;

    /// The results in one item.
    fn results_in(&self, item: &Value) -> Vec<Outcome>;

    /// The assistant text of a non-streamed reply body.
    fn reply_text(&self, body: &Value) -> Option<String>;

    /// Read one decoded stream event's text and end into `reader`.
    fn read_event(&self, event: &Value, reader: &mut StreamReader);

    /// The data of the event that reports `error` (a provider's error body) in the stream,
    /// `sequence` its number where the format numbers events.
    fn error_data(&self, error: Map<String, Value>, _sequence: u64) -> Map<String, Value> {
        error
    }

    /// Whether events name their `type` in an `event:` line.
    fn named_events(&self) -> bool {
        false
    }

    /// The blank line that ends an event.
    fn event_gap(&self) -> &'static str {
        "\n\n"
    }

    /// A memory tool as this format declares it.
    fn declared(&self, spec: &memory_tools::Spec) -> Value;

    /// Whether an entry of a body's `tools` is one of ours.
    fn is_ours(&self, tool: &Value) -> bool;

    /// The `tools` entries that offer the `declared` memory tools.
    fn offered(&self, declared: Vec<Value>) -> Vec<Value> {
        declared
    }

    /// What the model said in a finished round besides its calls, as plain text.
    fn said(&self, round: &Round) -> String;

    /// A finished round as structured conversation items: the calls, then their results.
    fn round_items(&self, round: &Round) -> Vec<Value>;

    /// What a keep-alive looks like in this format's stream.
    fn keep_alive(&self) -> Bytes {
        Bytes::from_static(b": keep-alive\n\n")
    }

    /// This format's part in splicing a new response's rounds, its first round about to start.
    fn splice(&self) -> Box<dyn FormatSplice>;

    /// The last whole body with the `earlier` rounds' visible output in front and our calls
    /// taken out.
    fn merge_rounds(&self, body: &mut Value, earlier: &[Round]);

    /// The body field holding the reply's usage.
    fn usage_key(&self) -> &'static str {
        "usage"
    }
}

/// A format's part in splicing the memory tools' rounds into one response: the state only it
/// keeps, and what becomes of each event and whole body (the state every format shares is the
/// [`SpliceState`] it is handed).
pub(super) trait FormatSplice: std::fmt::Debug + Send {
    /// One decoded upstream stream event.
    fn event(&mut self, splice: &mut SpliceState, event: Map<String, Value>) -> Event;

    /// One whole (non-streamed) reply body: our calls taken out and the round recorded.
    fn whole(&mut self, splice: &mut SpliceState, body: &Value);

    /// The round has ended: forget what held for it alone.
    fn end_round(&mut self) {}

    /// The number of the next event the splice adds itself, where the format numbers events.
    fn next_sequence(&mut self) -> u64 {
        0
    }

    /// The event that closes the response after the error event that ends a refused round,
    /// where the format has one (`error`: the error body sent).
    fn failed(&mut self, _splice: &SpliceState, _error: &Value) -> Option<Vec<u8>> {
        None
    }

    /// The latest round's response id, where a round continues the reply as another response.
    fn latest_id(&self) -> Option<&str> {
        None
    }
}

/// `(name, id)` of a call, read from `item`'s `name` and `id_key` fields, when `is_call`.
fn call_of(is_call: bool, item: &Value, id_key: &str) -> Option<(String, String)> {
    is_call.then(|| {
        (
            item["name"].as_str().unwrap_or("").to_owned(),
            item[id_key].as_str().unwrap_or("").to_owned(),
        )
    })
}

/// `call` borrowed as the splice takes it.
fn borrowed(call: &Option<(String, String)>) -> Option<(&str, &str)> {
    call.as_ref().map(|(n, i)| (n.as_str(), i.as_str()))
}

/// Our calls' entries among `items` (blocks, output items, parts) with `is_ours_call` true,
/// dropped; the earlier rounds' `blocks` in front.
fn earlier_then_kept(
    earlier: &[Round],
    items: &Value,
    is_ours_call: impl Fn(&Value) -> bool,
) -> Value {
    let mut out: Vec<Value> = earlier
        .iter()
        .flat_map(|r| r.blocks.iter().cloned())
        .collect();
    out.extend(
        items
            .as_array()
            .into_iter()
            .flatten()
            .filter(|item| !is_ours_call(item))
            .cloned(),
    );
    Value::Array(out)
}

/// Whether `name` (a JSON value) names one of our tools.
fn names_ours(name: &Value) -> bool {
    name.as_str().is_some_and(memory_tools::is_memory_tool)
}

/// What a round of content blocks or parts said (Messages, Gemini): its text, thoughts left
/// out.
fn blocks_said(round: &Round) -> String {
    round
        .blocks
        .iter()
        .filter(|b| b["thought"] != true)
        .filter_map(|b| b["text"].as_str())
        .collect()
}
