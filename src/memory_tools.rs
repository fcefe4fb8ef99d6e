//! The memory tools the model may call in the middle of a reply: their neutral schemas, their
//! handlers over the store and the arena, and the turn's "already shown" set.
//!
//! - `memory_search(query, limit?)`: the exact search over everything the user has stored.
//! - `memory_reopen()`: this turn's full retrieved set from before the cap.
//! - `memory_chain(item)`: an item's chain: the other chunks of its message and its
//!   conversation's neighbours on both sides (the turn it replies to, the turn that answers it),
//!   read from the chain graph. Capture records no other links today.
//! - `memory_count(query, by)`: the matching evidence counted by conversation, month or speaker,
//!   with the item ids behind every count.
//!
//! Every call returns only items the model has not been shown during the turn: the frame's
//! rows and every earlier tool result count as shown ([`TurnState`]). A count returns numbers
//! and ids, never texts, so it shows nothing and repeats nothing. Items carry their row id
//! (`#812`), the handle `memory_chain` takes.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::arena::Arena;
use crate::frame::{self, REOPEN_TOOL, Turn};
use crate::memory::Memory;
use crate::recall::Turns;
use crate::retrieve::{PreparedQuery, search_without};
use crate::scan::kernels::Kernels;
use crate::store::StoreError;
use crate::types::{Role, RowId, UserId};

/// The search tool's name.
pub const SEARCH_TOOL: &str = "memory_search";
/// The chain tool's name.
pub const CHAIN_TOOL: &str = "memory_chain";
/// The count tool's name.
pub const COUNT_TOOL: &str = "memory_count";

/// Items a search returns when the model names no limit.
pub const SEARCH_LIMIT_DEFAULT: usize = 10;
/// The most items one search returns: enough for a broad question, few enough that one result
/// stays a small share of a context window.
pub const SEARCH_LIMIT_MAX: usize = 50;
/// Turns of the conversation on each side of an item that its chain reaches.
pub const CHAIN_REACH: usize = 3;
/// Rows a count scans for matches, best first.
pub const COUNT_DEPTH: usize = 200;
/// A row matches a count when its score reaches this share of the best score: the same
/// question's clear matches, not the long tail every search has.
pub const COUNT_MATCH_SHARE: f32 = 0.6;

/// One tool as offered to the model, before any provider's wrapping.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    pub name: &'static str,
    /// What the model reads: what the tool does and when to call it (the tools' instructions
    /// ride along here, so a request without the tools has no word of them).
    pub description: &'static str,
    /// The arguments as a JSON schema object.
    pub parameters: Value,
}

/// The four tools, in the order they are offered.
pub fn specs() -> Vec<Spec> {
    vec![
        Spec {
            name: SEARCH_TOOL,
            description: "Search everything stored in this user's long-term memory (every past conversation, verbatim) when the memory shown above seems incomplete for the question. Returns only items not shown yet this turn, best first, each with its id (#N), speaker and time.",
            parameters: json!({
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "What to look for, in plain words."},
                    "limit": {"type": "integer", "minimum": 1, "maximum": SEARCH_LIMIT_MAX, "description": "How many items at most (default 10)."}
                },
                "required": ["query"]
            }),
        },
        Spec {
            name: REOPEN_TOOL,
            description: "Reopen this turn's full retrieved memory from before the length cap: the items relevant to the question that were left out of the memory shown above. Returns only items not shown yet this turn.",
            parameters: json!({"type": "object", "properties": {}}),
        },
        Spec {
            name: CHAIN_TOOL,
            description: "Follow the chain of one memory item (#N from an earlier result): the rest of its message and the turns around it in its conversation (what it replies to, what answered it). Returns only items not shown yet this turn.",
            parameters: json!({
                "type": "object",
                "properties": {
                    "item": {"type": "integer", "description": "The item's id, the N of #N."}
                },
                "required": ["item"]
            }),
        },
        Spec {
            name: COUNT_TOOL,
            description: "Count the stored evidence matching a query, by conversation, by month or by speaker; returns each count with the ids of the items behind it (for questions such as how many times or how often).",
            parameters: json!({
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "What to count, in plain words."},
                    "by": {"type": "string", "enum": ["conversation", "month", "speaker"]}
                },
                "required": ["query", "by"]
            }),
        },
    ]
}

/// Whether `name` is one of the memory tools.
pub fn is_memory_tool(name: &str) -> bool {
    matches!(name, SEARCH_TOOL | REOPEN_TOOL | CHAIN_TOOL | COUNT_TOOL)
}

/// What a count groups its matches by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    Conversation,
    /// The calendar month of the turn (UTC), `unknown date` when it has no time.
    Month,
    /// The speaker's name, resolved at read time, else the role.
    Speaker,
}

/// One call of a memory tool, its arguments checked.
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    Search { query: String, limit: usize },
    Reopen,
    Chain { item: RowId },
    Count { query: String, by: Category },
}

impl Call {
    /// The call of tool `name` with `arguments` (the JSON text the model wrote; empty means no
    /// arguments). `Err` says what is wrong, for the model to read.
    pub fn parse(name: &str, arguments: &str) -> Result<Self, String> {
        let args: Value = if arguments.trim().is_empty() {
            json!({})
        } else {
            serde_json::from_str(arguments)
                .map_err(|e| format!("the arguments are not valid JSON: {e}"))?
        };
        let text = |key: &str| {
            args.get(key)
                .and_then(Value::as_str)
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .ok_or_else(|| format!("`{key}` must be a non-empty string"))
        };
        match name {
            SEARCH_TOOL => {
                let limit = match args.get("limit") {
                    None | Some(Value::Null) => SEARCH_LIMIT_DEFAULT,
                    Some(v) => v
                        .as_u64()
                        .filter(|&n| n >= 1)
                        .ok_or("`limit` must be a positive integer")?
                        .min(SEARCH_LIMIT_MAX as u64) as usize,
                };
                Ok(Self::Search {
                    query: text("query")?,
                    limit,
                })
            }
            REOPEN_TOOL => Ok(Self::Reopen),
            CHAIN_TOOL => {
                let item = match args.get("item") {
                    Some(Value::Number(n)) => n.as_u64(),
                    Some(Value::String(s)) => s.trim().trim_start_matches('#').parse().ok(),
                    _ => None,
                }
                .ok_or("`item` must be an item id such as 812 (from #812)")?;
                Ok(Self::Chain { item: RowId(item) })
            }
            COUNT_TOOL => {
                let by = match text("by")?.as_str() {
                    "conversation" => Category::Conversation,
                    "month" => Category::Month,
                    "speaker" => Category::Speaker,
                    other => {
                        return Err(format!(
                            "`by` must be conversation, month or speaker, not {other:?}"
                        ));
                    }
                };
                Ok(Self::Count {
                    query: text("query")?,
                    by,
                })
            }
            other => Err(format!("{other} is not a memory tool")),
        }
    }
}

/// What one call produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The result as the model reads it.
    pub text: String,
    /// The items returned, in the order shown: what the call retrieved, to be reheated.
    pub rows: Vec<RowId>,
}

/// One turn's memory-tool state: whose memory, what the turn retrieved before the cap, and
/// every item shown so far (the frame's rows, then each result's).
#[derive(Debug, Clone)]
pub struct TurnState {
    pub user: UserId,
    /// Whose rows the tools read: the asker's, or its group scope's members (the asker among
    /// them).
    scope: Vec<UserId>,
    /// Render time (Unix ms) for the items' ages.
    pub now_ms: Option<i64>,
    retrieved: Vec<RowId>,
    shown: HashSet<RowId>,
}

impl TurnState {
    /// The state after the frame: `scope` is whose rows the tools read (`[user]` unless the
    /// asker has a group scope), `retrieved` the turn's full retrieved set (best first),
    /// `frame_rows` what the frame showed.
    pub fn new(
        user: UserId,
        scope: &[UserId],
        now_ms: Option<i64>,
        retrieved: Vec<RowId>,
        frame_rows: &[RowId],
    ) -> Self {
        Self {
            user,
            scope: scope.to_vec(),
            now_ms,
            retrieved,
            shown: frame_rows.iter().copied().collect(),
        }
    }

    /// `rows` without those already shown and without repeats, order kept.
    pub fn unseen(&self, rows: impl IntoIterator<Item = RowId>) -> Vec<RowId> {
        let mut seen = HashSet::new();
        rows.into_iter()
            .filter(|row| !self.shown.contains(row) && seen.insert(*row))
            .collect()
    }

    /// Mark `rows` as shown.
    pub fn show(&mut self, rows: &[RowId]) {
        self.shown.extend(rows.iter().copied());
    }

    /// Run `call` over the caught-up `arena` of `memory`; what it returns is marked shown.
    pub fn run(
        &mut self,
        memory: &Memory,
        arena: &Arena,
        kernels: &Kernels,
        call: &Call,
    ) -> Result<Outcome, StoreError> {
        let mut read = Turns::default();
        let excluded = memory.store.scope_exclusions(&self.scope)?;
        let outcome = match call {
            Call::Search { query, limit } => {
                let prepared = PreparedQuery::new(&memory.dictionary, arena, query);
                // Every shown row may rank above the first unseen ones: ask for enough.
                let depth = limit.saturating_add(self.shown.len());
                let hits = search_without(
                    &memory.dictionary,
                    arena,
                    kernels,
                    &self.scope,
                    &prepared,
                    depth,
                    &excluded,
                );
                let mut rows = self.unseen(hits.iter().map(|h| h.row));
                rows.truncate(*limit);
                let turns = self.turns(memory, arena, &mut read, &rows, &excluded)?;
                self.items(SEARCH_TOOL, &turns)
            }
            Call::Reopen => {
                let rows = self.unseen(self.retrieved.iter().copied());
                let turns = self.turns(memory, arena, &mut read, &rows, &excluded)?;
                self.items(REOPEN_TOOL, &turns)
            }
            Call::Chain { item } => {
                let found = match arena.owner_in(*item, &self.scope) {
                    Some(owner) => memory.store.row(owner, *item)?.map(|row| (owner, row)),
                    None => None,
                };
                let Some((owner, row)) = found else {
                    return Ok(Outcome {
                        text: format!("{CHAIN_TOOL}: there is no item #{} in this memory", item.0),
                        rows: Vec::new(),
                    });
                };
                // The message's chunks, and the turns within reach before and after it.
                let first = row.message;
                let last = RowId(row.message.0 + u64::from(row.chunks.max(1)) - 1);
                let around = memory.store.conversation_rows_around(
                    owner,
                    &row.conversation,
                    *item,
                    CHAIN_REACH + usize::from(row.chunks),
                )?;
                let from = around
                    .iter()
                    .position(|&r| r == first)
                    .unwrap_or(0)
                    .saturating_sub(CHAIN_REACH);
                let to = around
                    .iter()
                    .position(|&r| r == last)
                    .map_or(around.len(), |p| (p + CHAIN_REACH + 1).min(around.len()));
                let rows = self.unseen(around[from..to].iter().copied());
                let turns = self.turns(memory, arena, &mut read, &rows, &excluded)?;
                self.items(CHAIN_TOOL, &turns)
            }
            Call::Count { query, by } => {
                let prepared = PreparedQuery::new(&memory.dictionary, arena, query);
                let hits = search_without(
                    &memory.dictionary,
                    arena,
                    kernels,
                    &self.scope,
                    &prepared,
                    COUNT_DEPTH,
                    &excluded,
                );
                let best = hits.first().map_or(0.0, |h| h.score);
                let rows: Vec<RowId> = hits
                    .iter()
                    .filter(|h| best > 0.0 && h.score >= best * COUNT_MATCH_SHARE)
                    .map(|h| h.row)
                    .collect();
                let turns = self.turns(memory, arena, &mut read, &rows, &excluded)?;
                return Ok(Outcome {
                    text: render_count(query, *by, &count(&turns, *by)),
                    rows,
                });
            }
        };
        self.show(&outcome.rows);
        Ok(outcome)
    }

    /// The stored turns of `rows` that the scope holds and their owners have not excluded (those
    /// still stored), speakers resolved.
    fn turns(
        &self,
        memory: &Memory,
        arena: &Arena,
        read: &mut Turns,
        rows: &[RowId],
        excluded: &HashSet<RowId>,
    ) -> Result<Vec<Turn>, StoreError> {
        let mut turns = Vec::with_capacity(rows.len());
        for &row in rows.iter().filter(|row| !excluded.contains(row)) {
            let Some(owner) = arena.owner_in(row, &self.scope) else {
                continue;
            };
            if let Some(turn) = read.turn(memory, owner, row)? {
                turns.push(turn);
            }
        }
        Ok(turns)
    }

    /// Items as the model reads them: a header line, then one item per line block, each
    /// `#ID [speaker, date, age] text`.
    fn items(&self, tool: &str, turns: &[Turn]) -> Outcome {
        let mut text = if turns.is_empty() {
            format!("{tool}: nothing that has not been shown already")
        } else {
            format!(
                "{tool}: {} item{} not shown before",
                turns.len(),
                if turns.len() == 1 { "" } else { "s" }
            )
        };
        for turn in turns {
            let _ = write!(
                text,
                "\n#{} {} {}",
                turn.row.0,
                frame::label(turn, self.now_ms, None),
                turn.text
            );
        }
        Outcome {
            text,
            rows: turns.iter().map(|t| t.row).collect(),
        }
    }
}

/// The category of `turn` under `by`.
fn category(turn: &Turn, by: Category) -> String {
    match by {
        Category::Conversation => turn.conversation.clone(),
        Category::Month => turn
            .timestamp_ms
            .and_then(chrono::DateTime::from_timestamp_millis)
            .map_or_else(
                || "unknown date".to_owned(),
                |t| t.format("%Y-%m").to_string(),
            ),
        Category::Speaker => turn.speaker.clone().unwrap_or_else(|| {
            match turn.role {
                Role::User => "user",
                Role::Assistant => "assistant",
                Role::System => "system",
                Role::Tool => "tool",
            }
            .to_owned()
        }),
    }
}

/// One category's count: distinct messages (a chunked message counts once) and the rows behind
/// them in capture order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counted {
    pub category: String,
    pub messages: usize,
    pub rows: Vec<RowId>,
}

/// The matching `turns` counted by `by`, largest count first (ties by category name).
pub fn count(turns: &[Turn], by: Category) -> Vec<Counted> {
    let mut groups: BTreeMap<String, (HashSet<RowId>, Vec<RowId>)> = BTreeMap::new();
    for turn in turns {
        let (messages, rows) = groups.entry(category(turn, by)).or_default();
        messages.insert(turn.message);
        rows.push(turn.row);
    }
    let mut out: Vec<Counted> = groups
        .into_iter()
        .map(|(category, (messages, mut rows))| {
            rows.sort_unstable();
            Counted {
                category,
                messages: messages.len(),
                rows,
            }
        })
        .collect();
    out.sort_by_key(|c| std::cmp::Reverse(c.messages));
    out
}

fn render_count(query: &str, by: Category, counts: &[Counted]) -> String {
    let by = match by {
        Category::Conversation => "conversation",
        Category::Month => "month",
        Category::Speaker => "speaker",
    };
    let total: usize = counts.iter().map(|c| c.messages).sum();
    let mut text = format!("{COUNT_TOOL}: {total} matching messages for {query:?}, by {by}");
    for counted in counts {
        let ids: Vec<String> = counted.rows.iter().map(|r| format!("#{}", r.0)).collect();
        let _ = write!(
            text,
            "\n{}: {} ({})",
            counted.category,
            counted.messages,
            ids.join(" ")
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(
        row: u64,
        message: u64,
        conversation: &str,
        speaker: Option<&str>,
        ms: Option<i64>,
    ) -> Turn {
        Turn {
            row: RowId(row),
            conversation: conversation.to_owned(),
            message: RowId(message),
            chunk: (row - message) as u16,
            chunks: (row - message) as u16 + 1,
            role: Role::User,
            speaker: speaker.map(str::to_owned),
            timestamp_ms: ms,
            text: format!("text {row}"),
            tokens: 2,
            quoted_whole: false,
        }
    }

    #[test]
    fn unseen_drops_the_shown_and_repeats_and_keeps_the_order() {
        let mut state = TurnState::new(
            UserId(1),
            &[UserId(1)],
            None,
            vec![RowId(5), RowId(3)],
            &[RowId(3)],
        );
        assert_eq!(
            state.unseen([RowId(7), RowId(3), RowId(5), RowId(7), RowId(1)]),
            [RowId(7), RowId(5), RowId(1)]
        );
        state.show(&[RowId(7)]);
        assert_eq!(state.unseen([RowId(7), RowId(5)]), [RowId(5)]);
    }

    #[test]
    fn counts_group_by_category_and_count_a_chunked_message_once() {
        const MAY: i64 = 1_683_554_160_000; // 2023-05-08
        const JUNE: i64 = 1_686_232_560_000; // 2023-06-08
        let turns = [
            turn(10, 10, "c1", Some("Caroline"), Some(MAY)),
            turn(11, 10, "c1", Some("Caroline"), Some(MAY)),
            turn(20, 20, "c2", Some("Melanie"), Some(JUNE)),
            turn(30, 30, "c2", None, None),
            turn(31, 31, "c3", Some("Caroline"), Some(JUNE)),
        ];
        let by_month = count(&turns, Category::Month);
        assert_eq!(
            by_month,
            [
                Counted {
                    category: "2023-06".into(),
                    messages: 2,
                    rows: vec![RowId(20), RowId(31)]
                },
                Counted {
                    category: "2023-05".into(),
                    messages: 1,
                    rows: vec![RowId(10), RowId(11)]
                },
                Counted {
                    category: "unknown date".into(),
                    messages: 1,
                    rows: vec![RowId(30)]
                },
            ]
        );
        let by_speaker: Vec<(String, usize)> = count(&turns, Category::Speaker)
            .into_iter()
            .map(|c| (c.category, c.messages))
            .collect();
        assert_eq!(
            by_speaker,
            [
                ("Caroline".to_owned(), 2),
                ("Melanie".to_owned(), 1),
                ("user".to_owned(), 1)
            ]
        );
        let by_conversation: Vec<(String, usize)> = count(&turns, Category::Conversation)
            .into_iter()
            .map(|c| (c.category, c.messages))
            .collect();
        assert_eq!(
            by_conversation,
            [
                ("c2".to_owned(), 2),
                ("c1".to_owned(), 1),
                ("c3".to_owned(), 1)
            ]
        );
        let text = render_count("pottery", Category::Month, &by_month);
        assert!(
            text.starts_with("memory_count: 4 matching messages"),
            "{text}"
        );
        assert!(text.contains("\n2023-05: 1 (#10 #11)"), "{text}");
    }

    #[test]
    fn calls_are_parsed_and_bad_arguments_explained() {
        assert_eq!(
            Call::parse(SEARCH_TOOL, r#"{"query": "pottery class"}"#),
            Ok(Call::Search {
                query: "pottery class".into(),
                limit: SEARCH_LIMIT_DEFAULT
            })
        );
        assert_eq!(
            Call::parse(SEARCH_TOOL, r#"{"query": "x", "limit": 500}"#),
            Ok(Call::Search {
                query: "x".into(),
                limit: SEARCH_LIMIT_MAX
            })
        );
        assert_eq!(Call::parse(REOPEN_TOOL, ""), Ok(Call::Reopen));
        assert_eq!(
            Call::parse(CHAIN_TOOL, r##"{"item": "#812"}"##),
            Ok(Call::Chain { item: RowId(812) })
        );
        assert_eq!(
            Call::parse(COUNT_TOOL, r#"{"query": "hikes", "by": "month"}"#),
            Ok(Call::Count {
                query: "hikes".into(),
                by: Category::Month
            })
        );
        for (name, args, reason) in [
            (SEARCH_TOOL, "{", "not valid JSON"),
            (SEARCH_TOOL, "{}", "`query`"),
            (SEARCH_TOOL, r#"{"query": "x", "limit": 0}"#, "`limit`"),
            (CHAIN_TOOL, "{}", "`item`"),
            (COUNT_TOOL, r#"{"query": "x", "by": "year"}"#, "`by`"),
            ("weather", "{}", "not a memory tool"),
        ] {
            let err = Call::parse(name, args).unwrap_err();
            assert!(err.contains(reason), "{name} {args}: {err}");
        }
        assert!(specs().iter().all(|s| is_memory_tool(s.name)));
        assert!(!is_memory_tool("weather"));
    }
}
