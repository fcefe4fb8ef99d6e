//! What a harness could send instead of the proxy's frame, at the same size: its own history
//! cut to the newest messages that fit (truncation), or kept whole with all but its newest
//! tool results replaced by a placeholder (tool-result clearing, as Anthropic's context editing
//! does), cut as well when even that does not fit. Pure functions over a request's
//! conversation items and their serialised sizes.

use serde_json::{Value, json};

/// What a cleared tool result reads.
pub const CLEARED: &str = "[tool result cleared]";

/// Bytes of a JSON list whose items serialise to `sizes` bytes: brackets and commas included.
pub fn list_bytes(sizes: &[usize]) -> usize {
    2 + sizes.iter().sum::<usize>() + sizes.len().saturating_sub(1)
}

/// Truncation: the first item kept when the newest items are kept while the list fits in
/// `budget` bytes, items from `keep` on (the live turn and its tool round) always.
pub fn truncate(sizes: &[usize], keep: usize, budget: usize) -> usize {
    let mut start = keep.min(sizes.len());
    let mut total = list_bytes(&sizes[start..]);
    while start > 0 {
        let comma = usize::from(start < sizes.len());
        let grown = total + sizes[start - 1] + comma;
        if grown > budget {
            break;
        }
        total = grown;
        start -= 1;
    }
    start
}

/// Where a tool result lies in a conversation: its item and, in a Messages content list, its
/// block (a Responses `*_output` item is a result as a whole).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Place {
    item: usize,
    block: Option<usize>,
}

/// The tool results of `items`, oldest first: Messages `tool_result` blocks, Responses items
/// whose type ends in `_output`.
fn results(items: &[Value]) -> Vec<Place> {
    let mut out = Vec::new();
    for (item, value) in items.iter().enumerate() {
        let kind = value.get("type").and_then(Value::as_str).unwrap_or("");
        if kind.ends_with("_output") && kind != "message" {
            out.push(Place { item, block: None });
        }
        for (block, b) in value["content"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            if b.get("type").and_then(Value::as_str) == Some("tool_result") {
                out.push(Place {
                    item,
                    block: Some(block),
                });
            }
        }
    }
    out
}

/// The value a result's text is held in: a `tool_result` block's `content`, an output item's
/// `output`.
fn held(items: &mut [Value], at: Place) -> Option<&mut Value> {
    let item = &mut items[at.item];
    match at.block {
        Some(block) => item["content"].get_mut(block)?.get_mut("content"),
        None => item.get_mut("output"),
    }
}

/// Bytes `value` serialises to (compact, as a request carries it).
pub fn bytes_of(value: &Value) -> usize {
    serde_json::to_vec(value).map_or(0, |v| v.len())
}

/// Tool-result clearing within `budget` bytes: the items (whose serialised sizes are `sizes`)
/// with all but the newest N tool results replaced by [`CLEARED`], N the largest that fits;
/// when even N = 0 does not fit, the cleared list truncated ([`truncate`], items from `keep`
/// on always kept). A result no longer than the placeholder is left as it is. Returns the
/// kept items and their list's size in bytes.
pub fn clear(items: &[Value], sizes: &[usize], keep: usize, budget: usize) -> (Vec<Value>, usize) {
    let placeholder = bytes_of(&json!(CLEARED));
    let found = results(items);
    let mut out = items.to_vec();
    let savings: Vec<usize> = found
        .iter()
        .map(|&at| held(&mut out, at).map_or(0, |v| bytes_of(v).saturating_sub(placeholder)))
        .collect();
    let mut total = list_bytes(sizes);
    let mut cleared = 0;
    while total > budget && cleared < found.len() {
        total -= savings[cleared];
        cleared += 1;
    }
    let mut out_sizes = sizes.to_vec();
    for (&at, &saving) in found[..cleared].iter().zip(&savings) {
        if saving > 0
            && let Some(value) = held(&mut out, at)
        {
            *value = json!(CLEARED);
            out_sizes[at.item] -= saving;
        }
    }
    let start = truncate(&out_sizes, keep, budget);
    let size = list_bytes(&out_sizes[start..]);
    out.drain(..start);
    (out, size)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(items: &[Value]) -> Vec<usize> {
        items.iter().map(bytes_of).collect()
    }

    #[test]
    fn list_bytes_is_the_serialised_size() {
        let items = [json!("a"), json!({"b": 1}), json!([2])];
        assert_eq!(list_bytes(&sizes(&items)), bytes_of(&json!(items)));
        assert_eq!(list_bytes(&[]), 2);
    }

    #[test]
    fn truncation_keeps_the_newest_that_fit_and_the_live_turn_always() {
        let sizes = [10, 10, 10, 10];
        // The live turn is the last item: two more fit in 2 + 10 + 11 + 11 = 34.
        assert_eq!(truncate(&sizes, 3, 34), 1);
        assert_eq!(truncate(&sizes, 3, 33), 2);
        assert_eq!(truncate(&sizes, 3, 1_000), 0);
        // The live turn and its round are kept even when they alone run over.
        assert_eq!(truncate(&sizes, 2, 5), 2);
    }

    #[test]
    fn clearing_clears_the_oldest_results_first_then_truncates() {
        let long = "x".repeat(200);
        let items = vec![
            json!({"role": "user", "content": "Read both files"}),
            json!({"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "Read", "input": {}}]}),
            json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": long}]}),
            json!({"role": "assistant", "content": [{"type": "tool_use", "id": "b", "name": "Read", "input": {}}]}),
            json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "b", "content": long}]}),
        ];
        let s = sizes(&items);
        let whole = list_bytes(&s);
        let (kept, size) = clear(&items, &s, 0, whole);
        assert_eq!(
            (kept.len(), size),
            (5, whole),
            "everything fits: nothing cleared"
        );
        let (kept, size) = clear(&items, &s, 0, whole - 100);
        assert_eq!(kept[2]["content"][0]["content"], CLEARED);
        assert_eq!(
            kept[4]["content"][0]["content"],
            json!(long),
            "the newest result stays"
        );
        assert_eq!(size, bytes_of(&json!(kept)));
        let (kept, _) = clear(&items, &s, 0, whole - 300);
        assert_eq!(kept[4]["content"][0]["content"], CLEARED);
        assert_eq!(kept[0]["content"], "Read both files", "prompts stay");
        let (kept, size) = clear(&items, &s, 3, 120);
        assert_eq!(kept.len(), 2, "even cleared it does not fit: the oldest go");
        assert_eq!(size, bytes_of(&json!(kept)));
    }

    #[test]
    fn responses_outputs_are_results_too() {
        let items = vec![
            json!({"type": "function_call", "name": "shell", "arguments": "{}", "call_id": "c"}),
            json!({"type": "function_call_output", "call_id": "c", "output": "y".repeat(100)}),
            json!({"type": "function_call_output", "call_id": "d", "output": "ok"}),
        ];
        let s = sizes(&items);
        let (kept, _) = clear(&items, &s, 0, 60);
        assert_eq!(
            kept.last().unwrap()["output"],
            "ok",
            "shorter than the placeholder"
        );
        assert!(kept.iter().any(|i| i["output"] == CLEARED));
    }
}
