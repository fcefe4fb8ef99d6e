//! Long prompts of a working session through the proxy over real HTTP on loopback, in front of
//! a scripted upstream, over Anthropic Messages and OpenAI Chat Completions, both streamed: a
//! prompt of 50,000 characters, sent in a conversation that already has a few turns, reaches
//! the upstream whole (every character, in order, in one text of one forwarded message), and
//! so does a second prompt of 20,000 characters sent after a first one as long. Each prompt is
//! numbered lines with a token of their own, so a cut anywhere shows.

mod common;

use std::sync::Arc;

use serde_json::{Value, json};

use common::upstream::{Harness, Received, body_of, header};
use common::wire::{self, Reply, Wire, wire_of};

/// The short turns the conversation holds before its long prompt.
const EARLIER: [&str; 3] = [
    "We are moving the billing service to the new cluster this week.",
    "The migration script runs in five steps; step three copies the ledger tables.",
    "I will paste the log of last night's run next; it is long.",
];

/// The text the upstream answers the request `index` with.
fn reply_text(index: usize) -> String {
    format!("Reply {index} from the upstream: noted.")
}

/// A prompt of exactly `chars` characters (ASCII): a request, numbered lines each with a token
/// of its own, and a closing question; `tag` is in every line, so two prompts share none.
fn long_prompt(tag: &str, chars: usize) -> String {
    let closing = format!("\nEnd of the {tag} log. Which step failed first?");
    let mut text = format!("Here is the {tag} log of the migration, line by line:\n");
    let mut n: u64 = 0;
    while text.len() < chars - closing.len() {
        n += 1;
        let token = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
        text.push_str(&format!(
            "{tag} {n:05}: step {} copied table t{token:06x} ({} rows)\n",
            n % 5 + 1,
            n * 7919 % 100_000
        ));
    }
    text.truncate(chars - closing.len());
    text.push_str(&closing);
    text
}

/// One conversation of one client through the proxy: what it sends with each turn.
struct Conversation<'a> {
    h: &'a Harness,
    wire: Wire,
    /// The conversation's key (`x-perpetuity-conversation`).
    key: &'static str,
    /// The messages so far, as the client resends them with each turn.
    messages: Vec<Value>,
}

impl<'a> Conversation<'a> {
    fn new(h: &'a Harness, wire: Wire, key: &'static str) -> Self {
        let messages = match wire {
            Wire::Chat => vec![json!({"role": "system", "content": "You are a careful engineer."})],
            Wire::Messages | Wire::Responses | Wire::Gemini => Vec::new(),
        };
        Self {
            h,
            wire,
            key,
            messages,
        }
    }

    /// Send `prompt` as the next turn, after the history, and read its streamed answer to the
    /// end (the frame was used: `x-perpetuity-memory: ok`); the answer's text joins the history.
    /// Returns the request the upstream received for the turn.
    async fn turn(&mut self, prompt: &str) -> Received {
        self.messages
            .push(json!({"role": "user", "content": prompt}));
        let (path, mut headers, body) = match self.wire {
            Wire::Messages => (
                "/v1/messages",
                vec![
                    ("x-api-key", "ak-session"),
                    ("anthropic-version", "2023-06-01"),
                ],
                json!({"model": "claude-sonnet-4-5", "max_tokens": 1024, "stream": true,
                       "system": "You are a careful engineer.", "messages": self.messages}),
            ),
            Wire::Chat => (
                "/v1/chat/completions",
                vec![("authorization", "Bearer sk-session")],
                json!({"model": "gpt-4o", "stream": true, "messages": self.messages}),
            ),
            Wire::Responses | Wire::Gemini => {
                unreachable!("the conversations here speak Messages or Chat")
            }
        };
        headers.extend([
            ("content-type", "application/json"),
            ("x-perpetuity-conversation", self.key),
        ]);
        let before = self.h.received().len();
        let response = self
            .h
            .send("POST", path, &headers, body.to_string().as_bytes())
            .await;
        assert_eq!(response.status(), 200);
        assert_eq!(
            header(&response, "x-perpetuity-memory"),
            "ok",
            "the turn was framed"
        );
        body_of(response).await;
        let received = self.h.received();
        assert_eq!(
            received.len(),
            before + 1,
            "the turn made one upstream request"
        );
        let forwarded = received.into_iter().next_back().unwrap();
        assert_eq!(wire_of(&forwarded.path), Some(self.wire));
        self.messages
            .push(json!({"role": "assistant", "content": reply_text(before)}));
        forwarded
    }
}

/// The proxy in front of an upstream that answers every chat request with text.
async fn harness() -> Harness {
    let h = Harness::start(|_| {}).await;
    h.respond_with(Arc::new(|index, request| {
        wire::answer(index, request, |_, _| Reply::Text(reply_text(index)))
    }));
    h
}

/// Panics unless `prompt` is whole in one text of one message of `forwarded`; the message
/// says how much of it did arrive.
fn assert_whole(forwarded: &Received, prompt: &str, what: &str) {
    let body = forwarded.json();
    let texts = wire::message_texts(&body);
    if texts.iter().any(|(_, text)| text.contains(prompt)) {
        return;
    }
    let lines: Vec<&str> = prompt.lines().collect();
    let arrived = common::runs(
        (0..lines.len()).filter(|&at| texts.iter().any(|(_, text)| text.contains(lines[at]))),
    );
    let holding: Vec<(usize, usize)> = texts
        .iter()
        .filter(|(_, text)| lines.iter().any(|line| text.contains(line)))
        .map(|&(message, text)| (message, text.len()))
        .collect();
    panic!(
        "{what}: the prompt ({} characters, lines 0 to {}) is not whole in any forwarded text; \
         its lines {arrived:?} arrived, in the texts (message, characters) {holding:?}",
        prompt.len(),
        lines.len() - 1,
    );
}

/// A conversation of the short `EARLIER` turns, then a prompt of 50,000 characters.
async fn a_50000_character_prompt_arrives_whole(wire: Wire) {
    let h = harness().await;
    let mut conversation = Conversation::new(&h, wire, "long-prompt");
    for prompt in EARLIER {
        conversation.turn(prompt).await;
    }
    let prompt = long_prompt("nightly", 50_000);
    let forwarded = conversation.turn(&prompt).await;
    assert_whole(
        &forwarded,
        &prompt,
        "the 50,000-character prompt after three turns",
    );
}

/// A conversation of a prompt of 20,000 characters, then a second one as long.
async fn a_second_long_turn_arrives_whole(wire: Wire) {
    let h = harness().await;
    let mut conversation = Conversation::new(&h, wire, "two-long-turns");
    conversation.turn(&long_prompt("first", 20_000)).await;
    let second = long_prompt("second", 20_000);
    let forwarded = conversation.turn(&second).await;
    assert_whole(
        &forwarded,
        &second,
        "the second 20,000-character prompt, after the first",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_50000_character_prompt_arrives_whole_over_anthropic_messages() {
    a_50000_character_prompt_arrives_whole(Wire::Messages).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_50000_character_prompt_arrives_whole_over_openai_chat_completions() {
    a_50000_character_prompt_arrives_whole(Wire::Chat).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_long_turn_arrives_whole_over_anthropic_messages() {
    a_second_long_turn_arrives_whole(Wire::Messages).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_long_turn_arrives_whole_over_openai_chat_completions() {
    a_second_long_turn_arrives_whole(Wire::Chat).await;
}
