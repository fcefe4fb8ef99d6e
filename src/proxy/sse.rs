//! The chat APIs' server-sent event streams: cut into events as the bytes arrive, the reply's
//! text read out of them as they are relayed, and events written back in a format's own way.

use serde_json::{Map, Value};

use super::wire::Format;

/// An SSE stream cut into its events as the bytes arrive. Each byte is looked at once for the
/// blank line that ends an event, the events a feed completes leave the buffer in one move,
/// and an event that grows past the limit without ending is refused: an upstream cannot make
/// the proxy buffer or rescan without bound.
#[derive(Debug)]
pub struct Events {
    pending: Vec<u8>,
    /// The start of `pending` already looked at without finding an event's end.
    scanned: usize,
    limit: usize,
}

/// An event longer than its stream's limit, still without its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Oversize {
    pub limit: usize,
}

impl std::fmt::Display for Oversize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the upstream sent a stream event longer than {} bytes",
            self.limit
        )
    }
}

impl Events {
    /// Events of at most `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            pending: Vec::new(),
            scanned: 0,
            limit,
        }
    }

    /// Take in `bytes`; `each` gets every event they complete, in order, with the blank line
    /// that ended it, and the length of the event without it.
    pub fn feed(
        &mut self,
        bytes: &[u8],
        mut each: impl FnMut(&[u8], usize),
    ) -> Result<(), Oversize> {
        self.pending.extend_from_slice(bytes);
        // A blank line is at most four bytes: one that the new bytes complete starts at most
        // three bytes back.
        let mut from = self.scanned.saturating_sub(3);
        let mut start = 0;
        while let Some((end, gap)) = event_end_from(&self.pending[start..], from) {
            each(&self.pending[start..start + end + gap], end);
            start += end + gap;
            from = 0;
        }
        self.pending.drain(..start);
        self.scanned = self.pending.len();
        if self.pending.len() > self.limit {
            self.pending = Vec::new();
            self.scanned = 0;
            return Err(Oversize { limit: self.limit });
        }
        Ok(())
    }

    /// Whether the bytes so far end on an event boundary.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// The bytes after the last whole event; the buffer is empty afterwards.
    pub fn take_rest(&mut self) -> Vec<u8> {
        self.scanned = 0;
        std::mem::take(&mut self.pending)
    }
}

/// Reads the assistant text out of an SSE stream as its bytes pass by, keeping at most `limit`
/// bytes of it (a streamed reply is bounded as a whole one is) and refusing an event longer
/// than that.
#[derive(Debug)]
pub struct StreamReader {
    format: Format,
    events: Events,
    /// The most bytes of text kept, and of one event.
    limit: usize,
    text: String,
    complete: bool,
    /// An event ran over the limit: nothing after it is read, and the reply is incomplete.
    oversize: Option<Oversize>,
    /// The text reached the limit: the rest of the reply is relayed but not kept.
    cut: bool,
    /// The last Responses `sequence_number` seen, for an error event numbered after it.
    sequence: Option<u64>,
}

impl StreamReader {
    pub fn new(format: Format, limit: usize) -> Self {
        Self {
            format,
            events: Events::new(limit),
            limit,
            text: String::new(),
            complete: false,
            oversize: None,
            cut: false,
            sequence: None,
        }
    }

    /// Take in the next bytes of the stream.
    pub fn feed(&mut self, bytes: &[u8]) {
        if bytes.is_empty() || self.oversize.is_some() {
            return;
        }
        let mut events = std::mem::replace(&mut self.events, Events::new(0));
        let fed = events.feed(bytes, |event, end| self.event(&event[..end]));
        self.events = events;
        if let Err(oversize) = fed {
            self.oversize = Some(oversize);
            self.complete = false;
        }
    }

    /// Whether the stream so far ends on an event boundary; a proxy must end its last event with
    /// a blank line or clients drop it.
    pub fn terminated(&self) -> bool {
        self.events.is_empty()
    }

    /// The event that ran over the limit, once one has.
    pub fn oversize(&self) -> Option<Oversize> {
        self.oversize
    }

    /// The event that ends the stream with `error` (an error body in the provider's shape)
    /// where the upstream broke it off; Responses numbers it after the last event read.
    pub fn error_event(&self, error: &Value) -> Vec<u8> {
        error_event(self.format, error, self.sequence.map_or(0, |last| last + 1))
    }

    /// The text read so far, and whether the stream said it was complete.
    pub fn finish(mut self) -> (String, bool) {
        let rest = self.events.take_rest();
        if !rest.is_empty() && self.oversize.is_none() {
            self.event(&rest);
        }
        (
            self.text,
            self.complete && !self.cut && self.oversize.is_none(),
        )
    }

    /// The stream said the reply is complete.
    pub(super) fn complete(&mut self) {
        self.complete = true;
    }

    /// Whether any text was read yet.
    pub(super) fn has_text(&self) -> bool {
        !self.text.is_empty()
    }

    /// Add `piece` to the text, as far as the limit allows; a reply cut here is incomplete.
    pub(super) fn push(&mut self, piece: &str) {
        let room = self.limit.saturating_sub(self.text.len());
        if self.cut || piece.len() <= room {
            if !self.cut {
                self.text.push_str(piece);
            }
            return;
        }
        let mut cut = room;
        while !piece.is_char_boundary(cut) {
            cut -= 1;
        }
        self.text.push_str(&piece[..cut]);
        self.cut = true;
    }

    fn event(&mut self, event: &[u8]) {
        if self.oversize.is_some() {
            return;
        }
        let data = event_data(event);
        if data.trim() == "[DONE]" {
            self.complete = true;
            return;
        }
        let Ok(value) = serde_json::from_str::<Value>(&data) else {
            return;
        };
        if let Some(sequence) = value["sequence_number"].as_u64() {
            self.sequence = Some(sequence);
        }
        self.format.wire().read_event(&value, self);
    }
}

/// The `data:` of one SSE event (without its blank line), its lines joined by newlines.
pub fn event_data(event: &[u8]) -> String {
    let text = String::from_utf8_lossy(event);
    let mut data = String::new();
    for line in text.lines() {
        if let Some(value) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(value.strip_prefix(' ').unwrap_or(value));
        }
    }
    data
}

/// The event that reports `error` (a provider's error body, `{"error": {...}}`) in `format`'s
/// stream: the body itself for Chat and Gemini, typed `error` for Messages, and for Responses
/// an `error` event numbered `sequence` carrying the error's fields.
pub fn error_event(format: Format, error: &Value, sequence: u64) -> Vec<u8> {
    let body = error.as_object().cloned().unwrap_or_default();
    encode_event(format, &format.wire().error_data(body, sequence))
}

/// One SSE event carrying `data`, as `format`'s stream carries it: Responses and Messages name
/// the event's `type` in an `event:` line (left out when there is none, or when it holds a line
/// break and so could not stay one line); Gemini ends events with CRLF pairs, as its API does.
/// [`event_end`] finds exactly this one event in it, and [`event_data`] reads `data` back.
pub fn encode_event(format: Format, data: &Map<String, Value>) -> Vec<u8> {
    let mut out = Vec::new();
    let wire = format.wire();
    if wire.named_events()
        && let Some(kind) = data.get("type").and_then(Value::as_str)
        && !kind.contains(['\r', '\n'])
    {
        out.extend_from_slice(format!("event: {kind}\n").as_bytes());
    }
    out.extend_from_slice(b"data: ");
    serde_json::to_writer(&mut out, data).expect("a JSON map serialises");
    out.extend_from_slice(wire.event_gap().as_bytes());
    out
}

/// The end of the first complete event in `bytes` and the length of the blank line after it.
pub fn event_end(bytes: &[u8]) -> Option<(usize, usize)> {
    event_end_from(bytes, 0)
}

/// [`event_end`], for `bytes` whose first `from` bytes hold no blank line's start.
fn event_end_from(bytes: &[u8], from: usize) -> Option<(usize, usize)> {
    let mut i = from;
    while i < bytes.len() {
        for gap in [&b"\r\n\r\n"[..], b"\n\n", b"\r\r"] {
            if bytes[i..].starts_with(gap) {
                return Some((i, gap.len()));
            }
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// The events of `bytes` by [`event_end`] from the start each time, and the rest.
    fn events_whole(mut bytes: &[u8]) -> (Vec<(Vec<u8>, usize)>, Vec<u8>) {
        let mut out = Vec::new();
        while let Some((end, gap)) = event_end(bytes) {
            out.push((bytes[..end + gap].to_vec(), end));
            bytes = &bytes[end + gap..];
        }
        (out, bytes.to_vec())
    }

    proptest! {
        #[test]
        fn events_cut_anywhere_are_the_events_read_whole(
            parts in prop::collection::vec(
                prop::sample::select(vec![&b"data: {}"[..], b"\n", b"\r", b"\r\n", b"x", b"event: e\n"]),
                0..60,
            ),
            cuts in prop::collection::vec(0usize..400, 0..8),
        ) {
            let bytes = parts.concat();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(bytes.len())).collect();
            cuts.sort_unstable();
            let mut events = Events::new(usize::MAX);
            let mut out = Vec::new();
            let mut at = 0;
            for cut in cuts.into_iter().chain([bytes.len()]) {
                events
                    .feed(&bytes[at..cut], |event, end| out.push((event.to_vec(), end)))
                    .unwrap();
                at = cut;
            }
            prop_assert_eq!((out, events.take_rest()), events_whole(&bytes));
        }
    }

    #[test]
    fn an_event_over_the_limit_is_refused_and_a_long_reply_is_kept_cut() {
        let mut events = Events::new(16);
        let mut seen = 0;
        assert!(
            events
                .feed(b"data: 1\n\ndata: 22", |_, _| seen += 1)
                .is_ok()
        );
        assert_eq!(
            events.feed(b"2222222222", |_, _| seen += 1),
            Err(Oversize { limit: 16 })
        );
        assert_eq!(seen, 1);

        let mut reader = StreamReader::new(Format::Chat, 8);
        reader.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"0123456789\"}}]}\n\n");
        reader.feed(b"data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n");
        assert_eq!(reader.oversize(), None);
        assert_eq!(reader.finish(), ("01234567".to_owned(), false));
    }

    #[test]
    fn stream_text_survives_any_split_of_the_bytes() {
        let stream = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n\
                      data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Gr\u{fc}\u{df}e \"}}]}\n\n\
                      data: {\"choices\":[{\"index\":1,\"delta\":{\"content\":\"other choice\"}}]}\n\n\
                      data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\u{f7} 2\"},\"finish_reason\":\"stop\"}]}\n\n\
                      data: [DONE]\n\n";
        let bytes = stream.as_bytes();
        for cut in 0..bytes.len() {
            let mut reader = StreamReader::new(Format::Chat, 1 << 20);
            reader.feed(&bytes[..cut]);
            reader.feed(&bytes[cut..]);
            assert!(reader.terminated());
            assert_eq!(
                reader.finish(),
                ("Gr\u{fc}\u{df}e \u{f7} 2".to_owned(), true)
            );
        }
    }

    #[test]
    fn anthropic_text_deltas_and_an_unterminated_end() {
        let stream = "event: message_start\ndata: {\"type\":\"message_start\"}\n\n\
                      event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n\
                      event: message_stop\ndata: {\"type\":\"message_stop\"}";
        let mut reader = StreamReader::new(Format::Messages, 1 << 20);
        reader.feed(stream.as_bytes());
        assert!(!reader.terminated());
        assert_eq!(reader.finish(), ("Hi".to_owned(), true));
    }

    #[test]
    fn an_encoded_event_is_one_event_holding_its_data() {
        let cases = [
            (Format::Chat, json!({"id": "a", "choices": []}), "data: "),
            (Format::Gemini, json!({"candidates": []}), "data: "),
            (
                Format::Messages,
                json!({"type": "message_stop"}),
                "event: message_stop\ndata: ",
            ),
            (
                Format::Responses,
                json!({"type": "response.completed"}),
                "event: response.completed\ndata: ",
            ),
            (Format::Responses, json!({"error": {}}), "data: "),
            // A type holding a blank line would end the event early and make its data a
            // second event: the event line is left out.
            (
                Format::Messages,
                json!({"type": "a\n\ndata: {}", "text": "x\r\ny"}),
                "data: ",
            ),
        ];
        for (format, data, head) in cases {
            let Value::Object(data) = data else {
                unreachable!()
            };
            let event = encode_event(format, &data);
            let text = String::from_utf8(event.clone()).unwrap();
            assert!(text.starts_with(head), "{text:?}");
            let (end, gap) = event_end(&event).unwrap();
            assert_eq!(end + gap, event.len(), "{text:?}");
            let back: Value = serde_json::from_str(&event_data(&event[..end])).unwrap();
            assert_eq!(back, Value::Object(data));
        }
    }
}
