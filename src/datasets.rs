//! Public benchmark files as messages and questions: LoCoMo (`locomo10.json`), LongMemEval
//! (a JSON list of questions, each with its haystack of sessions) and RealMem (one file per
//! persona, or a folder of them; read whole, or one memory per persona's topic).
//!
//! Each LoCoMo conversation, LongMemEval question or RealMem persona becomes one user (key =
//! `sample_id`, `question_id` or `person_name`; `person_name/topic` for a topic read as a
//! memory of its own, [`Format::RealmemTopics`]); sessions become conversations; speakers
//! become names; session dates become timestamps; the file's own turn ids (`dia_id`, or
//! `session:index`) stay on the rows so an evaluation can find the evidence. A RealMem query is
//! a turn of the history: it is asked after the messages before it ([`Question::replay_at`]).
//! A file is parsed and checked whole before anything is returned: a bad file yields an error
//! naming the file and the position, and no messages.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use chrono::NaiveDateTime;
use serde::Deserialize;
use serde_json::Value;

use crate::capture::Message;
use crate::types::Role;

/// The supported file formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Locomo,
    Longmemeval,
    Realmem,
    /// RealMem, each persona's topic a memory of its own: the sessions whose identifier names
    /// the topic (`Travel_Planning_123:S2_01`), one plan discussed with the assistant over
    /// months; the persona's sessions of no named topic (`Enhanced:…`) and the queries whose
    /// evidence lies outside their topic are left out, and counted.
    RealmemTopics,
}

impl Format {
    /// Every format, in the order the command line lists them.
    pub const ALL: [Self; 4] = [
        Self::Locomo,
        Self::Longmemeval,
        Self::Realmem,
        Self::RealmemTopics,
    ];

    /// The format named `name` (what [`Format::name`] gives).
    pub fn named(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The name `--format` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Locomo => "locomo",
            Self::Longmemeval => "longmemeval",
            Self::Realmem => "realmem",
            Self::RealmemTopics => "realmem-topics",
        }
    }
}

/// A dataset file could not be used. Class: client (the file is bad); nothing is returned.
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Syntax or shape error, with serde's line and column.
    #[error("{path}:{line}:{column}: {message}")]
    Json {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    /// A value is missing or wrong; `at` names the item (e.g. `conv-26 session_3 turn 4`).
    #[error("{path}: {at}: {message}")]
    Invalid {
        path: PathBuf,
        at: String,
        message: String,
    },
}

/// A benchmark question, asked as its user.
#[derive(Debug, Clone, PartialEq)]
pub struct Question {
    pub user_key: String,
    pub question: String,
    /// LoCoMo's category number or LongMemEval's question type.
    pub category: String,
    /// Source turn ids holding the evidence (may be empty: abstention or no evidence).
    pub evidence_turns: Vec<String>,
    /// Conversation keys holding the evidence.
    pub evidence_sessions: Vec<String>,
    /// Evidence strings that named no turn, kept so they are reported rather than hidden.
    pub unresolved_evidence: Vec<String>,
    /// When the question is asked, in Unix milliseconds, if the file says.
    pub timestamp_ms: Option<i64>,
    /// Asked after this many of the dataset's messages are captured, and before the rest (a
    /// RealMem query, whose own turn is the message at this index); `None`: after them all.
    pub replay_at: Option<usize>,
    /// The conversation it is asked in (a RealMem query's session), where it is asked in one.
    pub conversation: Option<String>,
}

/// A parsed file.
#[derive(Debug, Clone, Default)]
pub struct Dataset {
    /// In capture order: user by user, session by session, turn by turn.
    pub messages: Vec<Message>,
    pub questions: Vec<Question>,
    /// Records of the file that could not be read, each named with why: left out, so that one
    /// odd record does not stop a whole evaluation.
    pub skipped: Vec<String>,
}

/// Read and check `path` as `format`. A RealMem path may be a folder: its `.json` files are
/// read in name order, one persona each.
pub fn load(format: Format, path: &Path) -> Result<Dataset, DatasetError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| DatasetError::Io { path, source }
    };
    let topics = format == Format::RealmemTopics;
    if matches!(format, Format::Realmem | Format::RealmemTopics) && path.is_dir() {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(path).map_err(io(path))? {
            let file = entry.map_err(io(path))?.path();
            if file.extension().is_some_and(|e| e == "json") {
                files.push(file);
            }
        }
        files.sort();
        if files.is_empty() {
            return Err(invalid(path, "folder".into(), "holds no .json file".into()));
        }
        let mut out = Dataset::default();
        for file in files {
            realmem(
                &file,
                &std::fs::read(&file).map_err(io(&file))?,
                topics,
                &mut out,
            )?;
        }
        return Ok(out);
    }
    let bytes = std::fs::read(path).map_err(io(path))?;
    match format {
        Format::Locomo => locomo(path, &bytes),
        Format::Longmemeval => longmemeval(path, &bytes),
        Format::Realmem | Format::RealmemTopics => {
            let mut out = Dataset::default();
            realmem(path, &bytes, topics, &mut out)?;
            Ok(out)
        }
    }
}

fn parse_json<'de, T: Deserialize<'de>>(path: &Path, bytes: &'de [u8]) -> Result<T, DatasetError> {
    serde_json::from_slice(bytes).map_err(|e| DatasetError::Json {
        path: path.to_path_buf(),
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    })
}

/// A value of the file at `at` is missing or wrong.
fn invalid(path: &Path, at: String, message: String) -> DatasetError {
    DatasetError::Invalid {
        path: path.to_path_buf(),
        at,
        message,
    }
}

/// Unix milliseconds of a naive (zone-less) date-time, read as UTC.
fn parse_time(text: &str, format: &str) -> Option<i64> {
    NaiveDateTime::parse_from_str(text.trim(), format)
        .ok()
        .map(|t| t.and_utc().timestamp_millis())
}

/// LoCoMo's session time format, e.g. `1:56 pm on 8 May, 2023`.
const LOCOMO_TIME: &str = "%I:%M %p on %d %B, %Y";
/// LongMemEval's date format, e.g. `2023/05/20 (Sat) 02:21`.
const LONGMEMEVAL_TIME: &str = "%Y/%m/%d (%a) %H:%M";
/// RealMem's session date, e.g. `2025-12-20 (Saturday)`, read at midnight.
const REALMEM_DATE: &str = "%Y-%m-%d (%A) %H:%M";

#[derive(Deserialize)]
struct LocomoSample {
    sample_id: String,
    conversation: serde_json::Map<String, Value>,
    qa: Vec<LocomoQa>,
}

#[derive(Deserialize)]
struct LocomoQa {
    question: String,
    #[serde(default)]
    evidence: Vec<String>,
    category: u64,
}

#[derive(Deserialize)]
struct LocomoTurn {
    speaker: String,
    dia_id: String,
    text: String,
    #[serde(default)]
    blip_caption: Option<String>,
}

/// Split one LoCoMo evidence string into turn ids, repairing the known malformed forms:
/// several ids in one string (`"D8:6; D9:17"`, space-joined lists), `"D:11:26"` for `D11:26`,
/// and zero-padded turn numbers (`"D30:05"` for `D30:5`).
pub fn locomo_evidence_ids(raw: &str) -> Vec<String> {
    raw.split(|c: char| c == ';' || c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(|id| {
            let id = id.replacen("D:", "D", 1);
            match id.split_once(':').map(|(d, t)| (d, t.parse::<u32>())) {
                Some((d, Ok(n))) => format!("{d}:{n}"),
                _ => id,
            }
        })
        .collect()
}

fn locomo(path: &Path, bytes: &[u8]) -> Result<Dataset, DatasetError> {
    let samples: Vec<LocomoSample> = parse_json(path, bytes)?;
    let invalid = |at, message| invalid(path, at, message);
    let mut out = Dataset::default();
    for sample in samples {
        let conv = &sample.conversation;
        let speaker = |key: &str| {
            conv.get(key)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| invalid(sample.sample_id.clone(), format!("missing {key}")))
        };
        let (speaker_a, speaker_b) = (speaker("speaker_a")?, speaker("speaker_b")?);
        // Iterate the session_<N> lists (conv-26 has date keys without sessions).
        let mut sessions: Vec<(u32, &Value)> = conv
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("session_")?.parse().ok()?, v)))
            .collect();
        sessions.sort_by_key(|&(n, _)| n);
        let mut session_of_turn: HashMap<String, String> = HashMap::new();
        for (n, turns) in sessions {
            let at = format!("{} session_{n}", sample.sample_id);
            let date_key = format!("session_{n}_date_time");
            let date = conv
                .get(&date_key)
                .and_then(Value::as_str)
                .ok_or_else(|| invalid(at.clone(), format!("missing {date_key}")))?;
            let start = parse_time(date, LOCOMO_TIME)
                .ok_or_else(|| invalid(at.clone(), format!("unreadable date {date:?}")))?;
            let turns: Vec<LocomoTurn> = serde_json::from_value(turns.clone())
                .map_err(|e| invalid(at.clone(), e.to_string()))?;
            for (i, turn) in turns.into_iter().enumerate() {
                let role = if turn.speaker == speaker_a {
                    Role::User
                } else if turn.speaker == speaker_b {
                    Role::Assistant
                } else {
                    return Err(invalid(
                        format!("{at} turn {i}"),
                        format!(
                            "speaker {:?} is neither speaker_a nor speaker_b",
                            turn.speaker
                        ),
                    ));
                };
                let mut text = turn.text;
                if let Some(caption) = turn.blip_caption {
                    text.push_str(&format!(" [shares image: {caption}]"));
                }
                session_of_turn.insert(turn.dia_id.clone(), format!("session_{n}"));
                out.messages.push(Message {
                    user_key: sample.sample_id.clone(),
                    conversation: format!("session_{n}"),
                    role,
                    name: Some(turn.speaker),
                    // Turns keep their order within the session: one second apart.
                    timestamp_ms: Some(start + i as i64 * 1000),
                    source_turn: Some(turn.dia_id),
                    text,
                });
            }
        }
        for qa in sample.qa {
            let mut question = Question {
                user_key: sample.sample_id.clone(),
                question: qa.question,
                category: qa.category.to_string(),
                evidence_turns: Vec::new(),
                evidence_sessions: Vec::new(),
                unresolved_evidence: Vec::new(),
                timestamp_ms: None,
                replay_at: None,
                conversation: None,
            };
            for raw in &qa.evidence {
                for id in locomo_evidence_ids(raw) {
                    match session_of_turn.get(&id) {
                        Some(session) => {
                            if !question.evidence_turns.contains(&id) {
                                question.evidence_turns.push(id);
                            }
                            if !question.evidence_sessions.contains(session) {
                                question.evidence_sessions.push(session.clone());
                            }
                        }
                        None => question.unresolved_evidence.push(raw.clone()),
                    }
                }
            }
            out.questions.push(question);
        }
    }
    Ok(out)
}

#[derive(Deserialize)]
struct LongMemEvalItem {
    question_id: String,
    question_type: String,
    question: String,
    #[serde(default)]
    question_date: Option<String>,
    haystack_session_ids: Vec<String>,
    haystack_dates: Vec<String>,
    haystack_sessions: Vec<Vec<LongMemEvalTurn>>,
    #[serde(default)]
    answer_session_ids: Vec<String>,
}

#[derive(Deserialize)]
struct LongMemEvalTurn {
    role: String,
    content: String,
    #[serde(default)]
    has_answer: bool,
}

fn longmemeval(path: &Path, bytes: &[u8]) -> Result<Dataset, DatasetError> {
    let items: Vec<LongMemEvalItem> = parse_json(path, bytes)?;
    let invalid = |at, message| invalid(path, at, message);
    let mut out = Dataset::default();
    for item in items {
        let id = &item.question_id;
        let n = item.haystack_sessions.len();
        if item.haystack_session_ids.len() != n || item.haystack_dates.len() != n {
            return Err(invalid(
                id.clone(),
                format!(
                    "{n} sessions but {} session ids and {} dates",
                    item.haystack_session_ids.len(),
                    item.haystack_dates.len()
                ),
            ));
        }
        let mut evidence_turns = Vec::new();
        for ((session_id, date), turns) in item
            .haystack_session_ids
            .iter()
            .zip(&item.haystack_dates)
            .zip(&item.haystack_sessions)
        {
            let at = format!("{id} session {session_id}");
            let start = parse_time(date, LONGMEMEVAL_TIME)
                .ok_or_else(|| invalid(at.clone(), format!("unreadable date {date:?}")))?;
            for (i, turn) in turns.iter().enumerate() {
                let role = match turn.role.as_str() {
                    "user" => Role::User,
                    "assistant" => Role::Assistant,
                    other => {
                        return Err(invalid(
                            format!("{at} turn {i}"),
                            format!("unknown role {other:?}"),
                        ));
                    }
                };
                let source_turn = format!("{session_id}:{i}");
                if turn.has_answer {
                    evidence_turns.push(source_turn.clone());
                }
                out.messages.push(Message {
                    user_key: id.clone(),
                    conversation: session_id.clone(),
                    role,
                    name: None,
                    timestamp_ms: Some(start + i as i64 * 1000),
                    source_turn: Some(source_turn),
                    text: turn.content.clone(),
                });
            }
        }
        out.questions.push(Question {
            user_key: id.clone(),
            question: item.question,
            category: item.question_type,
            evidence_turns,
            evidence_sessions: item.answer_session_ids,
            unresolved_evidence: Vec::new(),
            timestamp_ms: item
                .question_date
                .as_deref()
                .and_then(|d| parse_time(d, LONGMEMEVAL_TIME)),
            replay_at: None,
            conversation: None,
        });
    }
    Ok(out)
}

/// A RealMem persona's file: its sessions are read one by one ([`realmem`]).
#[derive(Deserialize)]
struct RealmemFile {
    #[serde(rename = "_metadata")]
    metadata: RealmemMetadata,
    dialogues: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
struct RealmemMetadata {
    person_name: String,
}

#[derive(Deserialize)]
struct RealmemSession {
    session_uuid: String,
    /// `Topic_Name_123:S2_01`, or `Enhanced:S10063` for a session of no named topic.
    #[serde(default)]
    session_identifier: String,
    current_time: String,
    #[serde(default)]
    extracted_memory: Vec<RealmemMemory>,
    dialogue_turns: Vec<RealmemTurn>,
}

/// A memory point the generator extracted (never stored: it only locates evidence turns). Its
/// content is text, or on some personas a JSON object (a structured point): either is a
/// point, matched to the reply's `memory_used` by equal value.
#[derive(Deserialize)]
struct RealmemMemory {
    content: serde_json::Value,
    #[serde(default)]
    source_content_snapshot: String,
}

#[derive(Deserialize)]
struct RealmemTurn {
    speaker: String,
    content: String,
    #[serde(default)]
    is_query: bool,
    #[serde(default)]
    category_name: Option<String>,
    #[serde(default)]
    memory_used: Vec<RealmemUsed>,
    #[serde(default)]
    memory_session_uuids: Vec<String>,
}

#[derive(Deserialize)]
struct RealmemUsed {
    session_uuid: String,
    /// Text or a JSON object, as the point it names ([`RealmemMemory`]).
    content: serde_json::Value,
}

/// A memory point's content as text: itself, or a structured point's JSON.
fn point_text(content: &serde_json::Value) -> String {
    match content {
        serde_json::Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// The topic of a RealMem session that belongs to none (`Enhanced:S10063`).
const REALMEM_NO_TOPIC: &str = "Enhanced";

/// Snapshots shorter than this are not matched inside a turn (only equal to one).
const REALMEM_MIN_EXCERPT: usize = 80;

/// The turn of `session` that a memory point used by a query came from: the point is found by
/// its content among the session's extracted memory, and its snapshot must equal exactly one
/// turn's text, or (80 characters or more) lie inside exactly one turn's. `None` where either
/// step is not certain: the snapshot is empty, edited or matches several turns.
fn realmem_evidence_turn(session: &RealmemSession, used: &RealmemUsed) -> Option<usize> {
    let point = session
        .extracted_memory
        .iter()
        .find(|point| point.content == used.content)?;
    let snapshot = point.source_content_snapshot.trim();
    let unique = |matches: Vec<usize>| (matches.len() == 1).then(|| matches[0]);
    let turns = &session.dialogue_turns;
    unique(
        (0..turns.len())
            .filter(|&i| turns[i].content.trim() == snapshot && !snapshot.is_empty())
            .collect(),
    )
    .or_else(|| {
        (snapshot.len() >= REALMEM_MIN_EXCERPT)
            .then(|| {
                unique(
                    (0..turns.len())
                        .filter(|&i| turns[i].content.contains(snapshot))
                        .collect(),
                )
            })
            .flatten()
    })
}

/// One RealMem persona, appended to `out`: its sessions in the file's order (the order of
/// their evidence; a session dated before the one before it takes that one's date), every
/// turn a message with
/// source id `session_uuid:index`, and each query a question asked at its own turn. Its
/// evidence sessions are the reply's `memory_session_uuids`; its evidence turns are the turns
/// of the reply's `memory_used` points ([`realmem_evidence_turn`]), given only when every point
/// is found; the points that are not are listed as unresolved. By `topics`, each topic is a
/// user of its own ([`Format::RealmemTopics`]).
fn realmem(path: &Path, bytes: &[u8], topics: bool, out: &mut Dataset) -> Result<(), DatasetError> {
    let file: RealmemFile = parse_json(path, bytes)?;
    let invalid = |at, message| invalid(path, at, message);
    let person = file.metadata.person_name;
    let mut sessions: Vec<RealmemSession> = Vec::with_capacity(file.dialogues.len());
    for (i, raw) in file.dialogues.into_iter().enumerate() {
        let uuid = raw
            .get("session_uuid")
            .and_then(|uuid| uuid.as_str())
            .unwrap_or("?")
            .to_owned();
        match serde_json::from_value(raw) {
            Ok(session) => sessions.push(session),
            Err(err) => out.skipped.push(format!(
                "{}: {person} session {i} ({uuid}): {err}",
                path.display()
            )),
        }
    }
    let by_uuid: HashMap<&str, &RealmemSession> = sessions
        .iter()
        .map(|session| (session.session_uuid.as_str(), session))
        .collect();
    // The user each session's turns belong to: the persona, or the persona's topic (none for
    // a session of no named topic).
    let user_of = |session: &RealmemSession| -> Option<String> {
        if !topics {
            return Some(person.clone());
        }
        let (topic, _) = session.session_identifier.split_once(':')?;
        (!topic.is_empty() && topic != REALMEM_NO_TOPIC).then(|| format!("{person}/{topic}"))
    };
    let mut previous = i64::MIN;
    for session in &sessions {
        let uuid = &session.session_uuid;
        let at = format!("{person} session {uuid}");
        let Some(user) = user_of(session) else {
            continue;
        };
        let date = format!("{} 00:00", session.current_time);
        let start = parse_time(&date, REALMEM_DATE).ok_or_else(|| {
            invalid(
                at.clone(),
                format!("unreadable date {:?}", session.current_time),
            )
        })?;
        // The file's order is the replay's: every query's evidence precedes it there, not
        // always in date order (one persona has sessions dated a day before the one before).
        let start = start.max(previous);
        previous = start;
        let turns = &session.dialogue_turns;
        for (i, turn) in turns.iter().enumerate() {
            let (role, name) = match turn.speaker.as_str() {
                "User" => (Role::User, Some(person.replace('_', " "))),
                "Assistant" => (Role::Assistant, None),
                other => {
                    return Err(invalid(
                        format!("{at} turn {i}"),
                        format!("unknown speaker {other:?}"),
                    ));
                }
            };
            let timestamp_ms = Some(start + i as i64 * 1000);
            if turn.is_query {
                let reply = turns
                    .get(i + 1)
                    .filter(|reply| reply.speaker == "Assistant");
                let used = reply.map_or(&[][..], |reply| &reply.memory_used[..]);
                let mut question = Question {
                    user_key: user.clone(),
                    question: turn.content.clone(),
                    category: turn.category_name.clone().unwrap_or_default(),
                    evidence_turns: Vec::new(),
                    evidence_sessions: Vec::new(),
                    unresolved_evidence: Vec::new(),
                    timestamp_ms,
                    replay_at: Some(out.messages.len()),
                    conversation: Some(uuid.clone()),
                };
                for uuid in reply
                    .into_iter()
                    .flat_map(|reply| &reply.memory_session_uuids)
                {
                    if !question.evidence_sessions.contains(uuid) {
                        question.evidence_sessions.push(uuid.clone());
                    }
                }
                for point in used {
                    let found = by_uuid
                        .get(point.session_uuid.as_str())
                        .and_then(|source| realmem_evidence_turn(source, point));
                    match found {
                        Some(turn) => {
                            let id = format!("{}:{turn}", point.session_uuid);
                            if !question.evidence_turns.contains(&id) {
                                question.evidence_turns.push(id);
                            }
                        }
                        None => question.unresolved_evidence.push(format!(
                            "{}: {}",
                            point.session_uuid,
                            point_text(&point.content)
                        )),
                    }
                }
                if !question.unresolved_evidence.is_empty() {
                    question.evidence_turns.clear();
                }
                let outside = question
                    .evidence_sessions
                    .iter()
                    .filter(|_| topics)
                    .find(|uuid| {
                        by_uuid.get(uuid.as_str()).and_then(|s| user_of(s)).as_ref() != Some(&user)
                    });
                match outside {
                    Some(outside) => out.skipped.push(format!(
                        "{}: {at} turn {i}: a query whose evidence session {outside} is not in \
                         its memory {user}",
                        path.display()
                    )),
                    None => out.questions.push(question),
                }
            }
            out.messages.push(Message {
                user_key: user.clone(),
                conversation: uuid.clone(),
                role,
                name,
                timestamp_ms,
                source_turn: Some(format!("{uuid}:{i}")),
                text: turn.content.clone(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn repairs_known_evidence_forms() {
        assert_eq!(locomo_evidence_ids("D8:6; D9:17"), ["D8:6", "D9:17"]);
        assert_eq!(locomo_evidence_ids("D:11:26"), ["D11:26"]);
        assert_eq!(locomo_evidence_ids("D30:05"), ["D30:5"]);
        assert_eq!(locomo_evidence_ids("D1:2 D1:3"), ["D1:2", "D1:3"]);
        assert_eq!(locomo_evidence_ids("D"), ["D"]);
    }

    /// A memory point written as a JSON object (as some personas write them) is a point like
    /// any other: the reply's `memory_used` names it by an equal object (its keys in any
    /// order), and its snapshot finds the evidence turn.
    #[test]
    fn a_realmem_memory_point_may_be_an_object() {
        let file = serde_json::json!({
            "_metadata": {"person_name": "Ada_Lovelace"},
            "dialogues": [
                {"session_uuid": "s1", "current_time": "2025-01-02 (Thursday)",
                 "extracted_memory": [
                    {"content": {"fact": "owns a loom", "since": 1840},
                     "source_content_snapshot": "I bought a loom last week."}
                 ],
                 "dialogue_turns": [
                    {"speaker": "User", "content": "I bought a loom last week."},
                    {"speaker": "Assistant", "content": "Lovely."}
                 ]},
                {"session_uuid": "s2", "current_time": "2025-01-09 (Thursday)",
                 "dialogue_turns": [
                    {"speaker": "User", "content": "What did I buy?", "is_query": true},
                    {"speaker": "Assistant", "content": "A loom.",
                     "memory_session_uuids": ["s1"],
                     "memory_used": [
                        {"session_uuid": "s1", "content": {"since": 1840, "fact": "owns a loom"}}
                     ]}
                 ]}
            ]
        });
        let bytes = serde_json::to_vec(&file).unwrap();
        let mut out = Dataset::default();
        realmem(Path::new("ada.json"), &bytes, false, &mut out).unwrap();
        assert_eq!(out.messages.len(), 4);
        let question = &out.questions[0];
        assert_eq!(question.evidence_turns, ["s1:0"]);
        assert!(question.unresolved_evidence.is_empty());
        assert_eq!(
            point_text(&serde_json::json!({"fact": "x"})),
            r#"{"fact":"x"}"#
        );
    }

    /// A session that cannot be read is left out and named; the rest of the persona is read.
    #[test]
    fn an_unreadable_realmem_session_is_skipped_and_named() {
        let file = serde_json::json!({
            "_metadata": {"person_name": "Ada_Lovelace"},
            "dialogues": [
                {"session_uuid": "odd", "current_time": "2025-01-02 (Thursday)",
                 "dialogue_turns": [{"speaker": "User", "content": 42}]},
                {"session_uuid": "s2", "current_time": "2025-01-09 (Thursday)",
                 "dialogue_turns": [{"speaker": "User", "content": "Hello."}]}
            ]
        });
        let bytes = serde_json::to_vec(&file).unwrap();
        let mut out = Dataset::default();
        realmem(Path::new("ada.json"), &bytes, false, &mut out).unwrap();
        assert_eq!(out.messages.len(), 1);
        assert_eq!(out.skipped.len(), 1);
        assert!(
            out.skipped[0].contains("session 0 (odd)"),
            "{:?}",
            out.skipped
        );
    }

    /// Read by topic, each topic is a user of its own: a session of no named topic is left
    /// out, and so is a query whose evidence lies in another topic (counted as skipped); read
    /// whole, the persona is one user holding every session and query.
    #[test]
    fn a_realmem_topic_is_a_memory_of_its_own() {
        let session = |uuid: &str, id: &str, turns: serde_json::Value| {
            serde_json::json!({"session_uuid": uuid, "session_identifier": id,
                               "current_time": "2025-01-02 (Thursday)", "dialogue_turns": turns})
        };
        let query = |text: &str, evidence: &str| {
            serde_json::json!([
                {"speaker": "User", "content": text, "is_query": true},
                {"speaker": "Assistant", "content": "Yes.", "memory_session_uuids": [evidence]}
            ])
        };
        let said = serde_json::json!([{"speaker": "User", "content": "A plan."}]);
        let file = serde_json::json!({
            "_metadata": {"person_name": "Ada_Lovelace"},
            "dialogues": [
                session("t1", "Travel_Planning_1:S1_01", said.clone()),
                session("f1", "Fitness_2:S1_01", said.clone()),
                session("e1", "Enhanced:S10001", said),
                session("t2", "Travel_Planning_1:S2_01", query("The trip?", "t1")),
                session("f2", "Fitness_2:S2_01", query("The trip again?", "t1")),
            ]
        });
        let bytes = serde_json::to_vec(&file).unwrap();
        let mut topics = Dataset::default();
        realmem(Path::new("ada.json"), &bytes, true, &mut topics).unwrap();
        let users: HashSet<&str> = topics
            .messages
            .iter()
            .map(|m| m.user_key.as_str())
            .collect();
        assert_eq!(
            users,
            HashSet::from(["Ada_Lovelace/Travel_Planning_1", "Ada_Lovelace/Fitness_2"])
        );
        assert_eq!(
            topics.messages.len(),
            6,
            "the session of no topic is left out"
        );
        assert_eq!(topics.questions.len(), 1);
        assert_eq!(
            topics.questions[0].user_key,
            "Ada_Lovelace/Travel_Planning_1"
        );
        assert_eq!(topics.skipped.len(), 1);
        assert!(
            topics.skipped[0].contains("evidence session t1"),
            "{:?}",
            topics.skipped
        );
        let mut whole = Dataset::default();
        realmem(Path::new("ada.json"), &bytes, false, &mut whole).unwrap();
        assert_eq!(whole.messages.len(), 7);
        assert_eq!(whole.questions.len(), 2);
        assert!(whole.skipped.is_empty());
        assert!(whole.messages.iter().all(|m| m.user_key == "Ada_Lovelace"));
    }

    #[test]
    fn reads_both_time_formats() {
        assert_eq!(
            parse_time("1:56 pm on 8 May, 2023", LOCOMO_TIME),
            Some(1_683_554_160_000)
        );
        assert_eq!(
            parse_time("2023/05/20 (Sat) 02:21", LONGMEMEVAL_TIME),
            Some(1_684_549_260_000)
        );
    }
}
