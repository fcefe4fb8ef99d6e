//! Real agent harnesses through the proxy: Claude Code and Codex as their own CLIs,
//! openai-node and the AI SDK (`tests/harness/node_clients.mjs`), openai-agents, langchain and
//! litellm (`tests/harness/py_clients.py`), at the versions `tools/install-deps.sh` pins. Each
//! runs its own tool loop against the proxy, in front of an upstream that answers every request
//! from its content: a call of the harness's tool while the request carries no tool result,
//! then text. Per client, in two separate sessions (the second with an image):
//!
//! - the reply reaches the client byte for byte;
//! - the loop's call and result reach the upstream paired;
//! - the live question appears exactly once in every request of its session;
//! - a fact told in the first session reaches the upstream in the second;
//! - the harness's own context (Claude Code's `<system-reminder>` blocks and trailing system
//!   message, Codex's developer messages, AGENTS.md and `<environment_context>` message, a
//!   library's system prompt) reaches every upstream request and is never stored as the user's
//!   words;
//! - each request of a tool loop extends the one before it (as a provider's prompt cache sees
//!   it: Anthropic `cache_control` markers and a text given as a string or as one text block
//!   are alike);
//! - the image reaches the upstream;
//! - a tool schema whose keys are not in alphabetical order reaches the upstream byte for byte.
//!
//! Claude Code also keeps a working session of five turns (`claude -p`, then `--continue`):
//! the fifth turn's request still holds a line deep inside the long file its first turn read.
//!
//! Gemini CLI (its default model, whose routing classifier precedes each turn, and `-m
//! gemini-2.5-flash`), OpenCode (Anthropic Messages, Chat Completions through
//! `@ai-sdk/openai-compatible`, Responses through its `openai` provider), pi (Messages, Chat,
//! Gemini), Aider (Chat and Messages, a file added to the chat), mini-swe-agent and pydantic-ai
//! (`tests/harness/pydantic_agent.py`: Chat, Responses, Messages, turns given the ones before as
//! `message_history`) run as their own programs, twice (two sessions), through a recorder in
//! front of the proxy that keeps each request as the harness sent it and the answer's
//! `x-perpetuity-memory`. Per harness:
//!
//! - a fact told in the first session reaches the upstream in the second;
//! - where it has tools, its loop completes (the upstream calls its `bash`, Gemini CLI's
//!   `read_file`, pydantic-ai's `get_weather`) and the call and its result reach the upstream
//!   paired;
//! - the live question is in every forwarded request of its session exactly once;
//! - what it composed reaches every turn's upstream request as it sent it: its system texts,
//!   its tools, and the items (Gemini: parts) holding its context (Gemini CLI's
//!   `<session_context>`, Aider's examples and files message with the acknowledgement after it);
//! - its side calls (Gemini CLI's router in JSON mode, OpenCode's title request) reach the
//!   upstream byte for byte with memory off, every turn with memory on, and no other harness
//!   makes one;
//! - only the user's words, the replies, calls and results are stored: no system text, context
//!   (Aider's file), side call or its answer; a template around the words (mini-swe-agent's task
//!   template, Aider's edit-format reminder on Messages) at most once;
//! - OpenCode's `x-session-id` names the stored conversation (`session:<id>`).
//!
//! A client that is not installed is a SKIP. What each client sends, recorded against a plain
//! stub, is in `tests/harness/recorded/`.

mod common;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use common::upstream::{Answer, Harness, Received};
use common::wire::{self, Reply, Wire, wire_of};
use perpetuity::proxy::harness::COMPACTION_REQUEST;
use perpetuity::types::Role;

/// What the first session tells, and the fact the second must be shown.
const TOLD: &str = "Please remember that my cat is called Zanzibar. What is the weather in Paris?";
const FACT: &str = "Zanzibar";
/// What the second session asks, with the image.
const ASKED: &str = "What is my cat called? And what is in this picture?";
/// A 1x1 PNG.
const PNG: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC";
/// The tools the upstream calls (never the proxy's memory tools), with their arguments.
/// (OpenCode's, pi's and mini-swe-agent's `bash`; Gemini CLI's `read_file` on [`NOTES`]).
const HARNESS_TOOLS: [(&str, &str); 5] = [
    (
        "Bash",
        r#"{"command":"echo harness-tool-ran","description":"Print a marker"}"#,
    ),
    ("exec_command", r#"{"cmd":"echo harness-tool-ran"}"#),
    ("get_weather", r#"{"zone":"CET","city":"Paris"}"#),
    ("bash", r#"{"command":"echo harness-tool-ran"}"#),
    ("read_file", r#"{"file_path":"harness-notes.txt"}"#),
];
/// The file in the working directory Gemini CLI's `read_file` is called on, and what it says.
const NOTES: (&str, &str) = ("harness-notes.txt", "harness-tool-ran\n");
/// The file Claude Code reads in the first turn of its working session ([`ledger`]): its
/// lines, the line deep inside it that says `LEDGER_CODE`, which nothing else in the session
/// says.
const LEDGER: &str = "ledger.txt";
const LEDGER_LINES: usize = 1_000;
const LEDGER_CODE_LINE: usize = 700;
const LEDGER_CODE: &str = "vault code QUILLON-58213-TARN";
/// The prompts of Claude Code's working session: the file read, three other things, the file.
/// None names a word of the ledger's lines (the last does not say which line it means), so the
/// search alone cannot bring line `LEDGER_CODE_LINE` back: the session must keep it.
const WORKING_SESSION: [&str; 5] = [
    "Read ledger.txt in this folder and tell me what it records.",
    "Something else: suggest a name for a grey cat.",
    "How many minutes are there in a day?",
    "Give me a title for a talk about caching.",
    "Back to ledger.txt, which you read at the start of this session: is anything in it out of place?",
];
/// One client run's limit.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);
/// The interactive Claude Code run's limit: its start, then each line answered
/// (`tests/harness/claude_interactive.py`).
const INTERACTIVE_TIMEOUT: Duration = Duration::from_secs(240);
/// The lines typed into Claude Code's interactive interface: a fact, the compaction, a question.
const INTERACTIVE_LINES: [&str; 3] = [
    "Please remember that my cat is called Zanzibar.",
    "/compact",
    "What is my cat called?",
];
/// The system prompt of the library drivers.
const DRIVER_SYSTEM: &str = "You are a terse assistant.";
/// The drivers' `get_weather` schema as openai-node, the AI SDK, the OpenAI Python SDK and the
/// Anthropic Python SDK write it.
const DRIVER_SCHEMA: &str = r#""properties":{"zone":{"type":"string","description":"time zone"},"city":{"type":"string"},"days":{"type":"integer"}},"required":["zone","city"]"#;
/// The same as litellm writes it for Messages (its own encoder, with spaces).
const DRIVER_SCHEMA_SPACED: &str = r#""properties": {"zone": {"type": "string", "description": "time zone"}, "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["zone", "city"]"#;
/// The project rules each CLI reads from its working directory.
const CLAUDE_RULE: &str = "Harness rule from CLAUDE.md: keep answers short.";
const AGENTS_RULE: &str = "Harness rule from AGENTS.md: keep answers short.";

/// The text the upstream answers the request `index` with, when it answers with text.
fn reply_text(index: usize) -> String {
    format!("Reply {index} from the upstream: naïve café, “quoted”, ✓ — done.")
}

/// A request's tool definitions, in any of the four formats (Gemini's function declarations
/// one by one).
fn tool_definitions(body: &Value) -> Vec<&Value> {
    body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|t| match t["functionDeclarations"].as_array() {
            Some(declared) => declared.iter().collect(),
            None => vec![t],
        })
        .collect()
}

/// The names of a request's tools, in any of the four formats.
fn tool_names(body: &Value) -> Vec<&str> {
    tool_definitions(body)
        .into_iter()
        .filter_map(|t| t["name"].as_str().or(t["function"]["name"].as_str()))
        .collect()
}

/// Whether the request carries any tool result.
fn has_result(wire: Wire, body: &Value) -> bool {
    let items = |key: &str| body[key].as_array().cloned().unwrap_or_default();
    match wire {
        Wire::Messages => items("messages").iter().any(|m| {
            m["content"]
                .as_array()
                .is_some_and(|blocks| blocks.iter().any(|b| b["type"] == "tool_result"))
        }),
        Wire::Responses => items("input").iter().any(|i| {
            i["type"]
                .as_str()
                .is_some_and(|t| t.ends_with("_call_output"))
        }),
        Wire::Chat => items("messages").iter().any(|m| m["role"] == "tool"),
        Wire::Gemini => items("contents").iter().any(|c| {
            c["parts"]
                .as_array()
                .is_some_and(|parts| parts.iter().any(|p| p.get("functionResponse").is_some()))
        }),
    }
}

/// The harness tool the upstream calls in answer to `body`, with its arguments: the first one
/// offered, while the request carries no tool result.
fn harness_call(wire: Wire, body: &Value) -> Option<(&'static str, &'static str)> {
    if has_result(wire, body) {
        return None;
    }
    let offered = tool_names(body);
    HARNESS_TOOLS
        .into_iter()
        .find(|(name, _)| offered.contains(name))
}

/// The upstream's answer to request `index`: the harness tool's call, else text.
fn answer(index: usize, request: &Received) -> Answer {
    wire::answer(index, request, |wire, body| {
        match harness_call(wire, body) {
            Some((name, arguments)) => Reply::Call(name.into(), arguments.into()),
            None => Reply::Text(reply_text(index)),
        }
    })
}

/// How a client is run.
#[derive(Clone, Copy)]
enum Runner {
    ClaudeCode,
    Codex,
    /// `node_clients.mjs` with this `CLIENT`.
    Node(&'static str),
    /// `py_clients.py` with this `CLIENT`.
    Python(&'static str),
}

/// One client under test.
struct Client {
    runner: Runner,
    /// Its API key, which names its memory.
    key: &'static str,
    /// Texts of the harness's own context, each in every upstream request and never in a
    /// stored user row.
    context: Vec<String>,
    /// A tool definition's bytes as the client writes them (keys not in alphabetical order).
    schema: &'static str,
}

/// Where the pinned clients are: the npm prefix, the Python, and Aider's Python environment.
struct Installed {
    npm: PathBuf,
    python: PathBuf,
    aider: PathBuf,
}

fn installed() -> Installed {
    let var = |name: &str, default: &str| {
        std::env::var_os(name).map_or_else(|| PathBuf::from(default), PathBuf::from)
    };
    Installed {
        npm: var("PERPETUITY_HARNESS_NPM", "/var/tmp/perpetuity-harness-npm"),
        python: var(
            "PERPETUITY_HARNESS_VENV",
            "/var/tmp/perpetuity-harness-venv",
        )
        .join("bin/python"),
        aider: var("PERPETUITY_AIDER_VENV", "/var/tmp/perpetuity-aider-venv"),
    }
}

/// What must exist for the client to run; `None` (with a SKIP line) when something is missing.
fn ready(runner: Runner, installed: &Installed) -> Option<()> {
    let bin = installed.npm.join("node_modules/.bin");
    let modules = installed.npm.join("node_modules");
    let needed: Vec<PathBuf> = match runner {
        Runner::ClaudeCode => vec![bin.join("claude")],
        Runner::Codex => vec![bin.join("codex")],
        Runner::Node(client) => {
            let mut needed = vec![modules.join("openai/package.json")];
            if let Some(provider) = client.strip_prefix("ai-") {
                needed.push(modules.join("ai/package.json"));
                needed.push(modules.join(format!("@ai-sdk/{provider}/package.json")));
            }
            needed
        }
        Runner::Python(_) => vec![installed.python.clone()],
    };
    if let Some(missing) = needed.iter().find(|p| !p.exists()) {
        println!(
            "SKIP: {} is absent (tools/install-deps.sh installs the harnesses)",
            missing.display()
        );
        return None;
    }
    if matches!(runner, Runner::Node(_)) && Command::new("node").arg("--version").output().is_err()
    {
        println!("SKIP: node is not on PATH");
        return None;
    }
    if let Runner::Python(client) = runner {
        let module = match client {
            "openai-agents" => "agents",
            "langchain-openai" => "langchain_openai",
            "langchain-anthropic" => "langchain_anthropic",
            _ => "litellm",
        };
        let probe = format!(
            "import importlib.util, sys; sys.exit(importlib.util.find_spec({module:?}) is None)"
        );
        let found = Command::new(&installed.python)
            .args(["-c", &probe])
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            println!(
                "SKIP: {module} is not installed in {} (tools/install-deps.sh installs it)",
                installed.python.display()
            );
            return None;
        }
    }
    Some(())
}

/// What one run of a client did: its final text, the tool calls it ran (the drivers print
/// them), and the chat requests the upstream received meanwhile, with their indices.
struct Session {
    reply: String,
    ran: Vec<String>,
    requests: Vec<(usize, Received)>,
}

/// The folders a client runs in: a working directory with its project rules, and a home.
struct Dirs {
    _root: tempfile::TempDir,
    work: PathBuf,
    home: PathBuf,
}

fn dirs() -> Dirs {
    let root = tempfile::tempdir().unwrap();
    let work = root.path().join("work");
    let home = root.path().join("home");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(work.join("CLAUDE.md"), format!("{CLAUDE_RULE}\n")).unwrap();
    std::fs::write(work.join("AGENTS.md"), format!("{AGENTS_RULE}\n")).unwrap();
    std::fs::write(
        work.join("picture.png"),
        base64::engine::general_purpose::STANDARD
            .decode(PNG)
            .expect("the PNG constant is base64"),
    )
    .unwrap();
    Dirs {
        _root: root,
        work,
        home,
    }
}

/// A command for `program` with none of this process's environment but `PATH` (no provider
/// keys, base URLs or HTTP proxies of the machine).
fn clean(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut command = Command::new(program);
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    command
}

/// How a client's run sends its prompt.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// As text, in a new session.
    New,
    /// With the image, in a new session.
    Image,
    /// As text, the next turn of the working directory's last session (`claude -p
    /// --continue`; Claude Code only).
    Continued,
}

/// The command that runs `runner` once against the proxy at `base` with `prompt` as `turn`
/// says, and the stdin it reads.
fn command(
    runner: Runner,
    installed: &Installed,
    dirs: &Dirs,
    base: &str,
    key: &str,
    prompt: &str,
    turn: Turn,
) -> (Command, Vec<u8>) {
    assert!(
        turn != Turn::Continued || matches!(runner, Runner::ClaudeCode),
        "only Claude Code's runs continue a session here"
    );
    let image = turn == Turn::Image;
    let bin = installed.npm.join("node_modules/.bin");
    let harness_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/harness");
    let mut stdin = Vec::new();
    let mut command = match runner {
        Runner::ClaudeCode => {
            let mut command = clean(bin.join("claude"));
            command
                .env("ANTHROPIC_BASE_URL", base)
                .env("ANTHROPIC_API_KEY", key)
                .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
                .env("DISABLE_AUTOUPDATER", "1")
                .env("DISABLE_TELEMETRY", "1")
                .env("DISABLE_ERROR_REPORTING", "1")
                .args(["--allowedTools", "Bash(echo:*)", "-p"]);
            if turn == Turn::Continued {
                command.arg("--continue");
            }
            if image {
                command.args([
                    "--input-format",
                    "stream-json",
                    "--output-format",
                    "stream-json",
                    "--verbose",
                ]);
                let content = json!([
                    {"type": "text", "text": prompt},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
                ]);
                let line = json!({"type": "user", "message": {"role": "user", "content": content}});
                stdin = format!("{line}\n").into_bytes();
            } else {
                command.arg(prompt);
            }
            command
        }
        Runner::Codex => {
            let codex_home = dirs.home.join("codex");
            std::fs::create_dir_all(&codex_home).unwrap();
            std::fs::write(
                codex_home.join("config.toml"),
                format!(
                    "model = \"gpt-5.5\"\nmodel_provider = \"proxy\"\n\n[model_providers.proxy]\n\
                     name = \"proxy\"\nbase_url = \"{base}/v1\"\nenv_key = \"HARNESS_API_KEY\"\n\
                     wire_api = \"responses\"\n"
                ),
            )
            .unwrap();
            let mut command = clean(bin.join("codex"));
            command
                .env("CODEX_HOME", codex_home)
                .env("HARNESS_API_KEY", key)
                .args([
                    "exec",
                    "--skip-git-repo-check",
                    "-s",
                    "danger-full-access",
                    prompt,
                ]);
            if image {
                command.arg("-i").arg(dirs.work.join("picture.png"));
            }
            command
        }
        Runner::Node(client) => {
            let mut command = clean("node");
            command
                .arg(harness_dir.join("node_clients.mjs"))
                .env("HARNESS_NPM", &installed.npm)
                .env("CLIENT", client);
            command
        }
        Runner::Python(client) => {
            let mut command = clean(&installed.python);
            command
                .arg(harness_dir.join("py_clients.py"))
                .env("CLIENT", client)
                .env("LITELLM_LOCAL_MODEL_COST_MAP", "True");
            command
        }
    };
    if matches!(runner, Runner::Node(_) | Runner::Python(_)) {
        command
            .env("BASE_URL", base)
            .env("API_KEY", key)
            .env("PROMPT", prompt);
        if image {
            command.env("IMAGE", PNG);
        }
    }
    command
        .env("HOME", &dirs.home)
        .env("LANG", "C.UTF-8")
        .current_dir(&dirs.work);
    (command, stdin)
}

/// The id the upstream gave the call of `tool` it made in answer to request `index` (on
/// Gemini, whose calls have no ids, the tool's name).
fn call_id(wire: Wire, index: usize, tool: &str) -> String {
    match wire {
        Wire::Messages => format!("toolu_harness_{index}"),
        Wire::Responses | Wire::Chat => format!("call_harness_{index}"),
        Wire::Gemini => tool.to_owned(),
    }
}

/// Run `command` to its end within `limit` (killed past it): status, stdout, stderr.
fn run_bounded(mut command: Command, stdin: Vec<u8>, limit: Duration) -> (bool, String, String) {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the client starts");
    let mut input = child.stdin.take().unwrap();
    input.write_all(&stdin).unwrap();
    drop(input);
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let out = std::thread::spawn(move || std::io::read_to_string(&mut out).unwrap_or_default());
    let err = std::thread::spawn(move || std::io::read_to_string(&mut err).unwrap_or_default());
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > limit {
            child.kill().unwrap();
            child.wait().unwrap();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (out, mut err) = (out.join().unwrap(), err.join().unwrap());
    if status.is_none() {
        err.push_str(&format!("\n(killed after {limit:?})"));
    }
    (status.is_some_and(|s| s.success()), out, err)
}

/// Run the client once; panics with its output when it fails.
async fn session(
    client: &Client,
    h: &Harness,
    installed: &Installed,
    dirs: &Dirs,
    prompt: &str,
    turn: Turn,
) -> Session {
    let before = h.received().len();
    let base = format!("http://{}", h.proxy);
    let (command, stdin) = command(
        client.runner,
        installed,
        dirs,
        &base,
        client.key,
        prompt,
        turn,
    );
    let (ok, out, err) =
        tokio::task::spawn_blocking(move || run_bounded(command, stdin, CLIENT_TIMEOUT))
            .await
            .unwrap();
    assert!(
        ok,
        "the client failed\nstdout:\n{out}\nstderr:\n{}",
        tail(&err)
    );
    let reply = match client.runner {
        Runner::ClaudeCode if turn == Turn::Image => out
            .lines()
            .rev()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|event| event["type"] == "result")
            .and_then(|event| event["result"].as_str().map(str::to_owned)),
        Runner::ClaudeCode | Runner::Codex => out.strip_suffix('\n').map(str::to_owned),
        Runner::Node(_) | Runner::Python(_) => out
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("REPLY "))
            .and_then(|l| serde_json::from_str::<String>(l).ok()),
    };
    let ran = out
        .lines()
        .filter_map(|l| l.strip_prefix("TOOL "))
        .map(str::to_owned)
        .collect();
    let requests = h
        .received()
        .into_iter()
        .enumerate()
        .skip(before)
        .filter(|(_, r)| wire_of(&r.path).is_some())
        .collect();
    Session {
        reply: reply.unwrap_or_else(|| panic!("no reply in the client's output:\n{out}")),
        ran,
        requests,
    }
}

fn tail(text: &str) -> &str {
    let start = text.len().saturating_sub(4000);
    let start = (start..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    &text[start..]
}

/// A request's conversation list (Messages and Chat `messages`, Responses `input` as items,
/// Gemini `contents`).
fn conversation(wire: Wire, body: &Value) -> Vec<Value> {
    match wire {
        Wire::Messages | Wire::Chat => body["messages"].as_array().cloned().unwrap_or_default(),
        Wire::Gemini => body["contents"].as_array().cloned().unwrap_or_default(),
        Wire::Responses => match &body["input"] {
            Value::String(text) => vec![json!({"role": "user", "content": text})],
            input => input.as_array().cloned().unwrap_or_default(),
        },
    }
}

/// A value as a provider's prompt cache sees it: `cache_control` markers dropped and a content
/// given as a string turned into its one text block.
fn as_cached(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| *k != "cache_control")
                .map(|(k, v)| match (k.as_str(), v) {
                    ("content" | "system", Value::String(text)) => {
                        (k.clone(), json!([{"type": "text", "text": text}]))
                    }
                    _ => (k.clone(), as_cached(v)),
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(as_cached).collect()),
        other => other.clone(),
    }
}

/// Whether `next` extends `previous` as a prompt cache sees them: the same instructions and
/// tools, and `previous`'s conversation as the start of `next`'s. `Err` says where not.
fn extends(wire: Wire, previous: &Value, next: &Value) -> Result<(), String> {
    for key in ["system", "instructions", "systemInstruction", "tools"] {
        if as_cached(&previous[key]) != as_cached(&next[key]) {
            return Err(format!("`{key}` differs"));
        }
    }
    let (before, after) = (conversation(wire, previous), conversation(wire, next));
    if after.len() < before.len() {
        return Err(format!(
            "{} items, fewer than the {} before",
            after.len(),
            before.len()
        ));
    }
    match before
        .iter()
        .zip(&after)
        .position(|(a, b)| as_cached(a) != as_cached(b))
    {
        Some(at) => Err(format!(
            "item {at} differs:\nbefore {}\nafter  {}",
            before[at], after[at]
        )),
        None => Ok(()),
    }
}

/// Whether the request holds the call `id` followed by its result, which says `output` (on
/// Gemini, whose calls have no ids, `id` is the function's name).
fn paired(wire: Wire, body: &Value, id: &str, output: &str) -> bool {
    let items = conversation(wire, body);
    let gemini_part = |item: &Value, kind: &str| {
        item["parts"].as_array().is_some_and(|parts| {
            parts.iter().any(|p| {
                p[kind]["name"] == id
                    && (kind == "functionCall" || p[kind]["response"].to_string().contains(output))
            })
        })
    };
    let call = items.iter().position(|item| match wire {
        Wire::Messages => item["content"]
            .as_array()
            .is_some_and(|b| b.iter().any(|b| b["type"] == "tool_use" && b["id"] == id)),
        Wire::Responses => item["type"] == "function_call" && item["call_id"] == id,
        Wire::Chat => item["tool_calls"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["id"] == id)),
        Wire::Gemini => gemini_part(item, "functionCall"),
    });
    let result = |item: &Value| match wire {
        Wire::Messages => item["content"].as_array().is_some_and(|b| {
            b.iter()
                .any(|b| b["tool_use_id"] == id && b["content"].to_string().contains(output))
        }),
        Wire::Responses => {
            item["type"] == "function_call_output"
                && item["call_id"] == id
                && item["output"].to_string().contains(output)
        }
        Wire::Chat => {
            item["role"] == "tool"
                && item["tool_call_id"] == id
                && item["content"].to_string().contains(output)
        }
        Wire::Gemini => gemini_part(item, "functionResponse"),
    };
    call.is_some_and(|at| items[at + 1..].iter().any(result))
}

/// Failed checks, reported together.
#[derive(Default)]
struct Checks(Vec<String>);

impl Checks {
    fn check(&mut self, holds: bool, what: impl FnOnce() -> String) {
        if !holds {
            self.0.push(what());
        }
    }

    fn finish(self, client: &str) {
        assert!(
            self.0.is_empty(),
            "{client}: {} check(s) failed:\n- {}",
            self.0.len(),
            self.0.join("\n- ")
        );
    }
}

/// Run `client` through the proxy in two sessions and check everything the module doc lists.
async fn exercise(name: &str, client: Client) {
    let installed = installed();
    if ready(client.runner, &installed).is_none() {
        return;
    }
    let h = Harness::start(|_| {}).await;
    h.respond_with(Arc::new(answer));
    let dirs = dirs();
    let told = session(&client, &h, &installed, &dirs, TOLD, Turn::New).await;
    let asked = session(&client, &h, &installed, &dirs, ASKED, Turn::Image).await;
    let mut checks = Checks::default();

    for (label, session, prompt) in [("first", &told, TOLD), ("second", &asked, ASKED)] {
        for (index, request) in &session.requests {
            let seen = occurrences(&request.json(), prompt);
            checks.check(seen == 1, || {
                format!("request {index} ({label} session) holds the live question {seen} times")
            });
        }
        let Some((last, _)) = session.requests.last() else {
            checks.check(false, || format!("the {label} session reached no upstream"));
            continue;
        };
        checks.check(session.reply == reply_text(*last), || {
            format!(
                "the {label} session's reply arrives byte for byte: got {:?}, sent {:?}",
                session.reply,
                reply_text(*last)
            )
        });
        for (index, request) in &session.requests {
            let text = request.text();
            for context in &client.context {
                checks.check(text.contains(context.as_str()), || {
                    format!(
                        "request {index} ({label} session) lacks the harness context {context:?}"
                    )
                });
            }
            checks.check(text.contains(client.schema), || {
                let compact = client.schema.replace(": ", ":").replace(", ", ",");
                let kept = if text.contains(&compact) {
                    "its key order is kept, its spacing is not"
                } else {
                    "not even its key order is kept"
                };
                format!(
                    "request {index} lacks the tool schema as the client wrote it ({kept}): {}",
                    client.schema
                )
            });
        }
        for pair in session.requests.windows(2) {
            let ((i, previous), (j, next)) = (&pair[0], &pair[1]);
            let wire = wire_of(&next.path).unwrap();
            if let Err(why) = extends(wire, &previous.json(), &next.json()) {
                checks.check(false, || {
                    format!("request {j} of a tool loop does not extend request {i}: {why}")
                });
            }
        }
    }

    let requests = &told.requests;
    checks.check(requests.len() >= 2, || {
        format!(
            "the first session's tool loop made {} upstream request(s), not a call and its continuation",
            requests.len()
        )
    });
    if let [(first, call_request), rest @ ..] = requests.as_slice() {
        let wire = wire_of(&call_request.path).unwrap();
        let (tool, _) = harness_call(wire, &call_request.json())
            .expect("the first request of the first session offers the harness's tool");
        let id = call_id(wire, *first, tool);
        let output = if tool == "get_weather" {
            "Sunny in Paris"
        } else {
            "harness-tool-ran"
        };
        checks.check(
            rest.last()
                .is_some_and(|(_, r)| paired(wire, &r.json(), &id, output)),
            || {
                format!(
                    "the loop's last request lacks the call {id} paired with its result {output:?}"
                )
            },
        );
        if tool == "get_weather" {
            checks.check(told.ran.len() == 1, || {
                format!("the client ran its tool {} times, not once", told.ran.len())
            });
        }
    }

    match asked.requests.first() {
        Some((index, request)) => {
            let text = request.text();
            checks.check(text.contains(FACT), || {
                format!("request {index}, the second session's first, lacks the fact told in the first session ({FACT:?})")
            });
            checks.check(text.contains(PNG), || {
                format!("request {index}, the second session's first, lacks the image")
            });
        }
        None => checks.check(false, || "the second session reached no upstream".into()),
    }

    // The inspector's log of the client's requests: each body as forwarded is one the
    // upstream received, byte for byte, the newest the second session's last.
    let log = common::upstream::body_of(
        h.send(
            "GET",
            "/perpetuity/api/requests",
            &[("authorization", &format!("Bearer {}", client.key))],
            b"",
        )
        .await,
    )
    .await;
    let log: Value = serde_json::from_slice(&log).unwrap();
    let received: Vec<Vec<u8>> = h.received().into_iter().map(|r| r.body).collect();
    let logged = log["requests"].as_array().cloned().unwrap_or_default();
    checks.check(!logged.is_empty(), || {
        format!("the inspector logged none of the client's requests: {log}")
    });
    for (at, summary) in logged.iter().enumerate() {
        let id = summary["id"].as_u64().unwrap_or_default();
        let whole = common::upstream::body_of(
            h.send(
                "GET",
                &format!("/perpetuity/api/request?id={id}"),
                &[("authorization", &format!("Bearer {}", client.key))],
                b"",
            )
            .await,
        )
        .await;
        let whole: Value = serde_json::from_slice(&whole).unwrap();
        let forwarded = whole["forwarded"].as_str().unwrap_or_default().as_bytes();
        checks.check(received.iter().any(|body| body == forwarded), || {
            format!("logged request {id} was not forwarded as the log says")
        });
        if at == 0 {
            let last = asked.requests.last().map(|(_, r)| r.body.as_slice());
            checks.check(last == Some(forwarded), || {
                format!("the newest logged request {id} is not the second session's last")
            });
        }
    }

    let rows = h.rows_of(client.key, 4);
    let user_rows: Vec<_> = rows.iter().filter(|r| r.role == Role::User).collect();
    checks.check(user_rows.iter().any(|r| r.text.contains(FACT)), || {
        "the user's words of the first session are not stored as the user's".into()
    });
    for context in &client.context {
        for row in user_rows
            .iter()
            .filter(|r| r.text.contains(context.as_str()))
        {
            checks.check(false, || {
                format!(
                    "row {:?} stores the harness context {context:?} as the user's words: {:?}",
                    row.id,
                    tail(&row.text)
                )
            });
        }
    }
    checks.finish(name);
}

fn library(runner: Runner, key: &'static str, schema: &'static str) -> Client {
    Client {
        runner,
        key,
        context: vec![DRIVER_SYSTEM.into()],
        schema,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_keeps_its_context_its_tool_loop_and_its_memory_through_the_proxy() {
    exercise("claude-code", claude_code("ak-harness-claude-code")).await;
}

/// Claude Code under the credential `key`: its context and its Bash tool's schema.
fn claude_code(key: &'static str) -> Client {
    Client {
        runner: Runner::ClaudeCode,
        key,
        context: vec![
            "<system-reminder>".into(),
            CLAUDE_RULE.into(),
            "You have been invoked in the following environment".into(),
        ],
        schema: r#""properties":{"command":{"description":"The command to execute","type":"string"},"timeout":{"#,
    }
}

/// Claude Code's working session, five `claude -p` runs in one working directory (the first
/// a new session, the rest `--continue`): the first has the upstream call its `Read` tool on a
/// long file, the next three ask of other things, the fifth of the file. The fifth turn's
/// request still holds what the first turn read, every line of the file (the line deep inside
/// it that says `LEDGER_CODE` checked on its own), and its prompt whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_keeps_its_working_session_and_what_it_read_through_the_proxy() {
    let installed = installed();
    if ready(Runner::ClaudeCode, &installed).is_none() {
        return;
    }
    let h = Harness::start(|_| {}).await;
    let dirs = dirs();
    let ledger = ledger();
    std::fs::write(dirs.work.join(LEDGER), &ledger).unwrap();
    // `Read` is called once, in answer to the session's first request; everything else is
    // answered with text.
    let read = json!({"file_path": dirs.work.join(LEDGER)}).to_string();
    let called = AtomicBool::new(false);
    h.respond_with(Arc::new(move |index, request| {
        wire::answer(index, request, |wire, body| {
            let first = wire == Wire::Messages
                && tool_names(body).contains(&"Read")
                && !has_result(wire, body)
                && !called.swap(true, Ordering::SeqCst);
            if first {
                Reply::Call("Read".into(), read.clone())
            } else {
                Reply::Text(reply_text(index))
            }
        })
    }));
    let client = claude_code("ak-harness-claude-session");
    let mut turns = Vec::new();
    for (at, prompt) in WORKING_SESSION.into_iter().enumerate() {
        let turn = if at == 0 { Turn::New } else { Turn::Continued };
        turns.push(session(&client, &h, &installed, &dirs, prompt, turn).await);
    }

    let read_round = &turns[0].requests;
    assert!(
        read_round.len() >= 2 && read_round.last().unwrap().1.text().contains(LEDGER_CODE),
        "the first turn's tool round did not bring the ledger's line {LEDGER_CODE_LINE} to the \
         upstream ({} requests): Claude Code did not read the file as scripted",
        read_round.len()
    );
    let (index, fifth) = turns[4]
        .requests
        .first()
        .expect("the fifth turn reached the upstream");
    let text = fifth.text();
    let mut checks = Checks::default();
    checks.check(text.contains(LEDGER_CODE), || {
        let held: Vec<usize> = (2..=5)
            .filter(|&turn| {
                turns[turn - 1]
                    .requests
                    .iter()
                    .any(|(_, r)| r.text().contains(LEDGER_CODE))
            })
            .collect();
        format!(
            "request {index}, the fifth turn's, lacks line {LEDGER_CODE_LINE} of the file the \
             first turn read ({LEDGER_CODE:?}); the turns whose requests hold it: {held:?}"
        )
    });
    // Every line the first turn read, not just the one asked for (the file's lines appear
    // verbatim in Claude Code's `Read` result, after their line numbers).
    let missing = common::runs(
        ledger
            .lines()
            .zip(1..)
            .filter(|(line, _)| !text.contains(line))
            .map(|(_, number)| number),
    );
    checks.check(missing.is_empty(), || {
        format!(
            "request {index}, the fifth turn's, lacks the lines {missing:?} of the \
             {LEDGER_LINES}-line file the first turn read"
        )
    });
    let prompt = WORKING_SESSION[4];
    checks.check(
        wire::message_texts(&fifth.json())
            .iter()
            .any(|(_, text)| text.contains(prompt)),
        || format!("request {index}, the fifth turn's, lacks its prompt whole ({prompt:?})"),
    );
    checks.finish("claude-code working session");
}

/// The file of the working session: `LEDGER_LINES` distinct numbered lines, line
/// `LEDGER_CODE_LINE` the one that holds `LEDGER_CODE`.
fn ledger() -> String {
    const GOODS: [&str; 7] = [
        "copper", "walnuts", "linen", "cobalt", "saffron", "glass", "tin",
    ];
    const PORTS: [&str; 5] = ["Lisbon", "Gdansk", "Valletta", "Bergen", "Izmir"];
    (1..=LEDGER_LINES)
        .map(|n| {
            if n == LEDGER_CODE_LINE {
                format!("{n:04} {LEDGER_CODE}\n")
            } else {
                format!(
                    "{n:04} crate {:05} of {} to {}, bay {}\n",
                    n * 37 % 100_000,
                    GOODS[n % GOODS.len()],
                    PORTS[n / GOODS.len() % PORTS.len()],
                    n % 13
                )
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_keeps_its_context_its_tool_loop_and_its_memory_through_the_proxy() {
    let client = Client {
        runner: Runner::Codex,
        key: "sk-harness-codex",
        context: vec![
            r#""role":"developer""#.into(),
            "# AGENTS.md instructions for ".into(),
            AGENTS_RULE.into(),
            "<environment_context>".into(),
        ],
        schema: r#"{"type":"function","name":"exec_command","description":""#,
    };
    exercise("codex", client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_node_chat_completions_loop_and_memory_work_through_the_proxy() {
    let client = library(
        Runner::Node("openai-chat"),
        "sk-harness-node-chat",
        DRIVER_SCHEMA,
    );
    exercise("openai-node chat", client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_node_responses_loop_and_memory_work_through_the_proxy() {
    let client = library(
        Runner::Node("openai-responses"),
        "sk-harness-node-responses",
        DRIVER_SCHEMA,
    );
    exercise("openai-node responses", client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ai_sdk_openai_loop_and_memory_work_through_the_proxy() {
    let client = library(
        Runner::Node("ai-openai"),
        "sk-harness-ai-openai",
        DRIVER_SCHEMA,
    );
    exercise("ai-sdk openai", client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ai_sdk_anthropic_loop_and_memory_work_through_the_proxy() {
    let client = library(
        Runner::Node("ai-anthropic"),
        "ak-harness-ai-anthropic",
        DRIVER_SCHEMA,
    );
    exercise("ai-sdk anthropic", client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_agents_loop_and_memory_work_through_the_proxy() {
    let client = library(
        Runner::Python("openai-agents"),
        "sk-harness-openai-agents",
        DRIVER_SCHEMA,
    );
    exercise("openai-agents", client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn langchain_openai_loop_and_memory_work_through_the_proxy() {
    let client = library(
        Runner::Python("langchain-openai"),
        "sk-harness-langchain-openai",
        DRIVER_SCHEMA,
    );
    exercise("langchain-openai", client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn langchain_anthropic_loop_and_memory_work_through_the_proxy() {
    let client = library(
        Runner::Python("langchain-anthropic"),
        "ak-harness-langchain-anthropic",
        DRIVER_SCHEMA,
    );
    exercise("langchain-anthropic", client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn litellm_openai_loop_and_memory_work_through_the_proxy() {
    let client = library(
        Runner::Python("litellm-openai"),
        "sk-harness-litellm-openai",
        DRIVER_SCHEMA,
    );
    exercise("litellm openai", client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn litellm_anthropic_loop_and_memory_work_through_the_proxy() {
    let client = library(
        Runner::Python("litellm-anthropic"),
        "ak-harness-litellm-anthropic",
        DRIVER_SCHEMA_SPACED,
    );
    exercise("litellm anthropic", client).await;
}

/// Claude Code in its interactive interface, typed into as a person would: the session's title
/// and `/compact` (side calls) reach the upstream as they came and are not remembered; the
/// conversation after the compaction holds only the user's words, and its request is shown the
/// fact the compaction summarised away, from the memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_interactive_titles_and_compaction_pass_through_unremembered() {
    let installed = installed();
    if ready(Runner::ClaudeCode, &installed).is_none() {
        return;
    }
    if Command::new("python3").arg("--version").output().is_err() {
        println!("SKIP: python3 is not on PATH (it drives the interactive interface)");
        return;
    }
    let h = Harness::start(|_| {}).await;
    h.respond_with(Arc::new(answer));
    let dirs = dirs();
    let key = "ak-harness-claude-interactive";
    let mut command = clean("python3");
    command
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/harness/claude_interactive.py"))
        .arg(installed.npm.join("node_modules/.bin/claude"))
        .arg(&dirs.work)
        .arg(&dirs.home)
        .args(INTERACTIVE_LINES)
        .env("ANTHROPIC_BASE_URL", format!("http://{}", h.proxy))
        .env("ANTHROPIC_API_KEY", key)
        .env("DISABLE_AUTOUPDATER", "1")
        .env("DISABLE_TELEMETRY", "1")
        .env("DISABLE_ERROR_REPORTING", "1")
        .env("LANG", "C.UTF-8")
        .current_dir(&dirs.work);
    let (ok, out, err) =
        tokio::task::spawn_blocking(move || run_bounded(command, Vec::new(), INTERACTIVE_TIMEOUT))
            .await
            .unwrap();
    assert!(
        ok,
        "the driver failed\nstdout:\n{out}\nstderr:\n{}",
        tail(&err)
    );
    let screen = std::fs::read(dirs.home.join("tty.log")).unwrap_or_default();
    let screen = String::from_utf8_lossy(&screen);
    let requests: Vec<Received> = h
        .received()
        .into_iter()
        .filter(|r| wire_of(&r.path) == Some(Wire::Messages))
        .collect();
    let offers_tools = |body: &Value| body["tools"].as_array().is_some_and(|t| !t.is_empty());
    let titles: Vec<Value> = requests
        .iter()
        .map(Received::json)
        .filter(|body| body["output_config"]["format"]["schema"]["properties"]["title"].is_object())
        .collect();
    let compactions: Vec<Value> = requests
        .iter()
        .map(Received::json)
        .filter(|body| {
            body["messages"]
                .as_array()
                .and_then(|m| m.last())
                .is_some_and(|last| last["content"].to_string().contains(COMPACTION_REQUEST))
        })
        .collect();
    assert!(
        !titles.is_empty() && !compactions.is_empty(),
        "the interface sent {} title and {} compaction requests (it runs as recorded in \
         tests/harness/recorded/claude-code-5.json and -6.json); screen:\n{}",
        titles.len(),
        compactions.len(),
        tail(&screen)
    );
    for body in titles.iter().chain(&compactions) {
        let tools = tool_names(body);
        assert!(
            !tools.iter().any(|t| t.starts_with("memory_")),
            "a side call was given the memory tools: {tools:?}"
        );
    }
    for title in &titles {
        assert_eq!(
            (
                title["messages"].as_array().map(Vec::len),
                title["tools"].clone()
            ),
            (Some(1), json!([])),
            "a title request reaches the upstream as Claude Code sent it: one message, no frame, no tools"
        );
    }

    let rows = h.rows_of(key, 4);
    let users: Vec<&str> = rows
        .iter()
        .filter(|r| r.role == Role::User)
        .map(|r| r.text.as_str())
        .collect();
    assert_eq!(
        users,
        [INTERACTIVE_LINES[0], INTERACTIVE_LINES[2]],
        "the user's rows are the two prompts' words, nothing of the title, the compaction or its summary"
    );
    for row in &rows {
        for side in [
            "<session>",
            COMPACTION_REQUEST,
            "This session is being continued",
            "/compact",
        ] {
            assert!(
                !row.text.contains(side),
                "row {:?} stores {side:?}: {:?}",
                row.id,
                tail(&row.text)
            );
        }
    }
    let last = requests
        .iter()
        .rev()
        .find(|r| r.text().contains(INTERACTIVE_LINES[2]) && offers_tools(&r.json()))
        .expect("the question after the compaction reached the upstream");
    assert!(
        last.text().contains("Zanzibar"),
        "the request after the compaction is shown the fact from the memory"
    );
}

/// What the second session of the CLIs below asks: only the first session told it.
const ASKED_AGAIN: &str = "What is my cat called?";
/// What pydantic-ai's first session asks next, with the first turn as its `message_history`.
const FOLLOW_UP: &str = "And in London?";
/// The file Aider is given in each run, and a line of it that nothing else says.
const AIDER_FILE: (&str, &str) = ("calc.py", "def add_harness(a, b):\n    return a + b\n");
const AIDER_FILE_LINE: &str = "def add_harness(a, b):";

/// A harness CLI (or pydantic-ai, through `tests/harness/pydantic_agent.py`) and the wire format
/// it is run with.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Cli {
    /// Gemini CLI with its default model (`None`) or `-m` this one.
    Gemini(Option<&'static str>),
    OpenCode(Wire),
    Pi(Wire),
    Aider(Wire),
    MiniSweAgent,
    PydanticAi(Wire),
}

/// One CLI under test.
struct CliCase {
    cli: Cli,
    /// Its API key, which names its memory.
    key: &'static str,
    /// Markers of the harness's own context: every text of a client request that holds one
    /// reaches the upstream as the same text, in the same item, and no stored message holds one.
    context: &'static [&'static str],
    /// The marker of the side call each session makes (it must pass through untouched, with
    /// memory off), or `None` where every request is a turn.
    side: Option<&'static str>,
    /// The marker of a template the harness repeats around the user's words, stored at most
    /// once.
    template: Option<&'static str>,
    /// The marker of a context message whose next message (the harness's canned
    /// acknowledgement) must follow it upstream too (Aider's files message).
    acknowledged: Option<&'static str>,
    /// Whether the harness's `x-session-id` must name the stored conversation (OpenCode).
    session_header: bool,
}

impl CliCase {
    fn new(cli: Cli, key: &'static str, context: &'static [&'static str]) -> Self {
        Self {
            cli,
            key,
            context,
            side: None,
            template: None,
            acknowledged: None,
            session_header: false,
        }
    }

    /// The prompts of its first and second session (process).
    fn prompts(&self) -> [&'static [&'static str]; 2] {
        match self.cli {
            Cli::PydanticAi(_) => [&[TOLD, FOLLOW_UP], &[ASKED_AGAIN]],
            _ => [&[TOLD], &[ASKED_AGAIN]],
        }
    }

    /// Whether the harness offers tools (the upstream calls one in the first session).
    fn has_tools(&self) -> bool {
        !matches!(self.cli, Cli::Aider(_))
    }
}

/// What must exist for `cli` to run; `None` (with a SKIP line) when something is missing.
fn cli_ready(cli: Cli, installed: &Installed) -> Option<()> {
    let bin = installed.npm.join("node_modules/.bin");
    let needed = match cli {
        Cli::Gemini(_) => bin.join("gemini"),
        Cli::OpenCode(_) => bin.join("opencode"),
        Cli::Pi(_) => bin.join("pi"),
        Cli::Aider(_) => installed.aider.join("bin/aider"),
        Cli::MiniSweAgent => installed.python.with_file_name("mini"),
        Cli::PydanticAi(_) => installed.python.clone(),
    };
    if !needed.exists() {
        println!(
            "SKIP: {} is absent (tools/install-deps.sh installs the harnesses)",
            needed.display()
        );
        return None;
    }
    let npm = matches!(cli, Cli::Gemini(_) | Cli::OpenCode(_) | Cli::Pi(_));
    if npm && Command::new("node").arg("--version").output().is_err() {
        println!("SKIP: node is not on PATH");
        return None;
    }
    if matches!(cli, Cli::PydanticAi(_)) {
        let found = Command::new(&installed.python)
            .args(["-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('pydantic_ai') is None)"])
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            println!(
                "SKIP: pydantic_ai is not installed in {} (tools/install-deps.sh installs it)",
                installed.python.display()
            );
            return None;
        }
    }
    Some(())
}

/// Write what `cli` reads before its first run: its settings or provider configuration
/// (pointed at `base` with `key`), and the files it is given.
fn prepare(cli: Cli, dirs: &Dirs, base: &str, key: &str) {
    let write = |path: PathBuf, text: String| {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    match cli {
        Cli::Gemini(_) => {
            write(dirs.work.join(NOTES.0), NOTES.1.into());
            let settings = json!({
                "security": {"auth": {"selectedType": "gemini-api-key"}},
                "privacy": {"usageStatisticsEnabled": false},
                "telemetry": {"enabled": false},
            });
            write(
                dirs.home.join(".gemini/settings.json"),
                settings.to_string(),
            );
        }
        Cli::OpenCode(_) => {
            let options = json!({"baseURL": format!("{base}/v1"), "apiKey": key});
            let config = json!({
                "autoupdate": false,
                "share": "disabled",
                "permission": {"bash": "allow"},
                "provider": {
                    "anthropic": {"options": options, "models": {"claude-sonnet-4-5": {"name": "harness sonnet"}}},
                    "harnesschat": {
                        "npm": "@ai-sdk/openai-compatible",
                        "name": "Harness Chat Completions",
                        "options": options,
                        "models": {"harness-model": {"name": "harness model", "tool_call": true}},
                    },
                    "openai": {"options": options, "models": {"gpt-5": {"name": "harness gpt-5"}}},
                },
            });
            write(dirs.work.join("opencode.json"), config.to_string());
        }
        Cli::Pi(_) => {
            let providers = json!({"providers": {
                "anthropic": {"baseUrl": base, "apiKey": key},
                "google": {"baseUrl": format!("{base}/v1beta"), "apiKey": key},
                "harnesschat": {
                    "baseUrl": format!("{base}/v1"),
                    "api": "openai-completions",
                    "apiKey": key,
                    "models": [{"id": "harness-model"}],
                },
            }});
            write(
                dirs.home.join(".pi/agent/models.json"),
                providers.to_string(),
            );
        }
        Cli::Aider(_) => write(dirs.work.join(AIDER_FILE.0), AIDER_FILE.1.into()),
        Cli::MiniSweAgent | Cli::PydanticAi(_) => {}
    }
}

/// The command that runs `cli` once, in a new session, against the proxy at `base` with
/// `prompts` (one, but pydantic-ai's driver runs several turns).
fn cli_command(
    cli: Cli,
    installed: &Installed,
    dirs: &Dirs,
    base: &str,
    key: &str,
    prompts: &[&str],
) -> Command {
    let bin = installed.npm.join("node_modules/.bin");
    let prompt = prompts[0];
    let mut command = match cli {
        Cli::Gemini(model) => {
            let mut command = clean(bin.join("gemini"));
            command
                .env("GEMINI_API_KEY", key)
                .env("GOOGLE_GEMINI_BASE_URL", base)
                .env("GEMINI_CLI_TRUST_WORKSPACE", "true");
            if let Some(model) = model {
                command.args(["-m", model]);
            }
            command.args(["-p", prompt]);
            command
        }
        Cli::OpenCode(wire) => {
            let model = match wire {
                Wire::Messages => "anthropic/claude-sonnet-4-5",
                Wire::Chat => "harnesschat/harness-model",
                _ => "openai/gpt-5",
            };
            let mut command = clean(bin.join("opencode"));
            let home = &dirs.home;
            command
                .env("XDG_CONFIG_HOME", home.join(".config"))
                .env("XDG_DATA_HOME", home.join(".local/share"))
                .env("XDG_CACHE_HOME", home.join(".cache"))
                .env("XDG_STATE_HOME", home.join(".local/state"))
                .env("OPENCODE_DISABLE_AUTOUPDATE", "1")
                .env("OPENCODE_DISABLE_LSP_DOWNLOAD", "1")
                .env("OPENCODE_DISABLE_SHARE", "1")
                .env("OPENCODE_DISABLE_MODELS_FETCH", "1")
                .env("OPENCODE_DISABLE_DEFAULT_PLUGINS", "1")
                .args(["run", "-m", model, prompt]);
            command
        }
        Cli::Pi(wire) => {
            let model = match wire {
                Wire::Messages => "anthropic/claude-sonnet-4-5",
                Wire::Chat => "harnesschat/harness-model",
                _ => "google/gemini-2.5-flash",
            };
            let mut command = clean(bin.join("pi"));
            command
                .env("PI_OFFLINE", "1")
                .args(["--model", model, "-p", prompt]);
            command
        }
        Cli::Aider(wire) => {
            let mut command = clean(installed.aider.join("bin/aider"));
            command.env("LITELLM_LOCAL_MODEL_COST_MAP", "True").args([
                "--no-check-update",
                "--no-show-release-notes",
                "--analytics-disable",
                "--no-show-model-warnings",
                "--no-pretty",
                "--yes-always",
                "--no-auto-commits",
                "--no-git",
            ]);
            match wire {
                Wire::Messages => command.env("ANTHROPIC_API_BASE", base).args([
                    "--model",
                    "anthropic/claude-sonnet-4-5",
                    "--anthropic-api-key",
                    key,
                ]),
                _ => command
                    .args(["--model", "openai/gpt-4o", "--openai-api-key", key])
                    .arg("--openai-api-base")
                    .arg(format!("{base}/v1")),
            };
            command.args(["--message", prompt, AIDER_FILE.0]);
            command
        }
        Cli::MiniSweAgent => {
            let mut command = clean(installed.python.with_file_name("mini"));
            command
                .env("MSWEA_CONFIGURED", "true")
                .env("MSWEA_COST_TRACKING", "ignore_errors")
                .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
                .env("OPENAI_API_KEY", key)
                .env("OPENAI_API_BASE", format!("{base}/v1"))
                .args([
                    "-m",
                    "openai/gpt-4o-mini",
                    "-t",
                    prompt,
                    "-y",
                    "--exit-immediately",
                    "-o",
                ])
                .arg(dirs.home.join("trajectory.json"));
            command
        }
        Cli::PydanticAi(wire) => {
            let client = match wire {
                Wire::Messages => "anthropic",
                Wire::Responses => "responses",
                _ => "chat",
            };
            let mut command = clean(&installed.python);
            command
                .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/harness/pydantic_agent.py"))
                .env("BASE_URL", base)
                .env("API_KEY", key)
                .env("CLIENT", client)
                .env("PROMPTS", json!(prompts).to_string());
            command
        }
    };
    command
        .env("HOME", &dirs.home)
        .env("LANG", "C.UTF-8")
        .current_dir(&dirs.work);
    command
}

/// One request as the client sent it, and what the proxy's answer said of the memory.
#[derive(Clone)]
struct Tapped {
    path: String,
    headers: hyper::HeaderMap,
    body: Vec<u8>,
    /// The answer's `x-perpetuity-memory` header.
    memory: String,
}

impl Tapped {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_default()
    }
}

/// A recorder between a client and the proxy: every request it passes on as it came, what
/// it was and what the answer said of the memory, the answer streamed back as it came.
struct Tap {
    url: String,
    seen: Arc<std::sync::Mutex<Vec<Tapped>>>,
}

impl Tap {
    async fn start(proxy: std::net::SocketAddr) -> Self {
        use http_body_util::{BodyExt as _, Full};
        use hyper::body::{Bytes, Incoming};
        use hyper_util::rt::{TokioExecutor, TokioIo};

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .build_http::<Full<Bytes>>();
        let shared = Arc::clone(&seen);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (seen, client) = (Arc::clone(&shared), client.clone());
                let service =
                    hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
                        let (seen, client) = (Arc::clone(&seen), client.clone());
                        async move {
                            let (mut parts, body) = request.into_parts();
                            let body = body
                                .collect()
                                .await
                                .map_err(std::io::Error::other)?
                                .to_bytes();
                            let path = parts
                                .uri
                                .path_and_query()
                                .map_or("/".into(), |p| p.to_string());
                            let at = {
                                let mut seen = seen.lock().unwrap();
                                seen.push(Tapped {
                                    path: path.clone(),
                                    headers: parts.headers.clone(),
                                    body: body.to_vec(),
                                    memory: String::new(),
                                });
                                seen.len() - 1
                            };
                            parts.uri = format!("http://{proxy}{path}")
                                .parse()
                                .map_err(std::io::Error::other)?;
                            parts.headers.remove(hyper::header::HOST);
                            let response = client
                                .request(hyper::Request::from_parts(parts, Full::new(body)))
                                .await
                                .map_err(std::io::Error::other)?;
                            seen.lock().unwrap()[at].memory = response
                                .headers()
                                .get("x-perpetuity-memory")
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or_default()
                                .to_owned();
                            Ok::<_, std::io::Error>(response)
                        }
                    });
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { url, seen }
    }

    fn seen(&self) -> Vec<Tapped> {
        self.seen.lock().unwrap().clone()
    }
}

/// What one run of a CLI did: the chat requests it sent (as it sent them) and those the
/// upstream received meanwhile, with their indices.
struct CliRun {
    sent: Vec<Tapped>,
    received: Vec<(usize, Received)>,
}

/// Run `case`'s CLI once with `prompts`; panics with its output when it fails.
async fn cli_run(
    case: &CliCase,
    h: &Harness,
    tap: &Tap,
    installed: &Installed,
    dirs: &Dirs,
    prompts: &[&str],
) -> CliRun {
    let (sent_before, received_before) = (tap.seen().len(), h.received().len());
    let command = cli_command(case.cli, installed, dirs, &tap.url, case.key, prompts);
    let started = Instant::now();
    let (ok, out, err) =
        tokio::task::spawn_blocking(move || run_bounded(command, Vec::new(), CLIENT_TIMEOUT))
            .await
            .unwrap();
    println!("{:?} ran in {:.1?}", case.cli, started.elapsed());
    assert!(
        ok,
        "{:?} failed\nstdout:\n{}\nstderr:\n{}",
        case.cli,
        tail(&out),
        tail(&err)
    );
    CliRun {
        sent: tap
            .seen()
            .into_iter()
            .skip(sent_before)
            .filter(|t| wire_of(&t.path).is_some())
            .collect(),
        received: h
            .received()
            .into_iter()
            .enumerate()
            .skip(received_before)
            .filter(|(_, r)| wire_of(&r.path).is_some())
            .collect(),
    }
}

/// Every string inside `value`.
fn strings(value: &Value) -> Vec<&str> {
    match value {
        Value::String(text) => vec![text.as_str()],
        Value::Array(items) => items.iter().flat_map(strings).collect(),
        Value::Object(map) => map.values().flat_map(strings).collect(),
        _ => Vec::new(),
    }
}

/// The texts of a request's system prompt or instructions (Chat and Responses system and
/// developer messages included).
fn system_texts(wire: Wire, body: &Value) -> Vec<String> {
    let mut texts: Vec<String> = match wire {
        Wire::Messages => strings(&body["system"])
            .into_iter()
            .filter(|t| *t != "text" && *t != "ephemeral")
            .map(str::to_owned)
            .collect(),
        Wire::Gemini => body["systemInstruction"]["parts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["text"].as_str().map(str::to_owned))
            .collect(),
        Wire::Responses => body["instructions"]
            .as_str()
            .map(str::to_owned)
            .into_iter()
            .collect(),
        Wire::Chat => Vec::new(),
    };
    for item in conversation(wire, body) {
        if item["role"] == "system" || item["role"] == "developer" {
            match &item["content"] {
                Value::String(text) => texts.push(text.clone()),
                content => texts.extend(
                    content
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|p| p["text"].as_str().map(str::to_owned)),
                ),
            }
        }
    }
    texts
}

/// How often `needle` occurs in the request `body` (its strings, one by one).
fn occurrences(body: &Value, needle: &str) -> usize {
    strings(body)
        .iter()
        .map(|s| s.matches(needle).count())
        .sum()
}

/// The first characters of `text`, to look for it.
fn head(text: &str) -> String {
    text.trim().chars().take(60).collect()
}

/// The items a harness's context arrives in: a request's conversation items, on Gemini the
/// parts of its contents (its `<session_context>` is a part of the first user content, beside
/// the user's words).
fn context_items(wire: Wire, body: &Value) -> Vec<Value> {
    let items = conversation(wire, body);
    match wire {
        Wire::Gemini => items
            .iter()
            .flat_map(|c| c["parts"].as_array().cloned().unwrap_or_default())
            .collect(),
        _ => items,
    }
}

/// Where the client's request `sent` and the one the upstream received for it, `received`,
/// differ in what the harness composed: its system texts, its tools, and the items (parts) holding
/// its context markers (Aider's files message and the acknowledgement after it).
fn composed(
    case: &CliCase,
    sent: &Value,
    received: &Value,
    wire: Wire,
    checks: &mut Checks,
    at: usize,
) {
    let arrived = strings(received);
    for text in system_texts(wire, sent) {
        checks.check(arrived.contains(&text.as_str()), || {
            format!(
                "request {at} lacks the harness's system text as it sent it: {:?}…",
                head(&text)
            )
        });
    }
    let tools = tool_definitions(received);
    for tool in tool_definitions(sent) {
        checks.check(tools.contains(&tool), || {
            format!(
                "request {at} lacks the harness's tool as it sent it: {}",
                tail(&tool.to_string())
            )
        });
    }
    let (items, forwarded) = (context_items(wire, sent), context_items(wire, received));
    for (n, item) in items.iter().enumerate() {
        let text = item.to_string();
        let Some(marker) = case.context.iter().find(|m| text.contains(*m)) else {
            continue;
        };
        let place = forwarded.iter().position(|f| f == item);
        checks.check(place.is_some(), || {
            let instead = forwarded.iter().find(|f| f.to_string().contains(marker));
            format!(
                "request {at} lacks the harness's item holding {marker:?} as it sent it:\nsent      {}\nforwarded {}",
                tail(&text),
                instead.map_or_else(|| "none holding it".into(), |f| tail(&f.to_string()).to_owned())
            )
        });
        if let (Some(place), Some(acknowledged)) = (place, case.acknowledged)
            && text.contains(acknowledged)
        {
            checks.check(forwarded.get(place + 1) == items.get(n + 1), || {
                format!(
                    "request {at}: the message after the one holding {acknowledged:?} is not the harness's {}",
                    items.get(n + 1).map_or_else(String::new, Value::to_string)
                )
            });
        }
    }
}

/// The upstream's answer for mini-swe-agent: its `bash` called with the marker's `echo`, then,
/// once a result is in, with the command that ends its task.
fn mini_answer(index: usize, request: &Received) -> Answer {
    wire::answer(index, request, |wire, body| {
        let command = if has_result(wire, body) {
            "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
        } else {
            "echo harness-tool-ran"
        };
        Reply::Call("bash".into(), json!({"command": command}).to_string())
    })
}

/// Run `case`'s CLI through a recorder and the proxy in two sessions (two processes) and
/// check what the module doc lists for these CLIs.
async fn exercise_cli(name: &str, case: CliCase) {
    let installed = installed();
    if cli_ready(case.cli, &installed).is_none() {
        return;
    }
    let h = Harness::start(|_| {}).await;
    if case.cli == Cli::MiniSweAgent {
        h.respond_with(Arc::new(mini_answer));
    } else {
        h.respond_with(Arc::new(answer));
    }
    let tap = Tap::start(h.proxy).await;
    let dirs = dirs();
    prepare(case.cli, &dirs, &tap.url, case.key);
    let prompts = case.prompts();
    let mut runs = Vec::new();
    for prompts in prompts {
        runs.push(cli_run(&case, &h, &tap, &installed, &dirs, prompts).await);
    }
    let mut checks = Checks::default();
    let mut side_indices = Vec::new();
    let mut turns = Vec::new();
    for (label, run, prompts) in [
        ("first", &runs[0], prompts[0]),
        ("second", &runs[1], prompts[1]),
    ] {
        let (sides, mains): (Vec<&Tapped>, Vec<&Tapped>) =
            run.sent.iter().partition(|t| t.memory == "off");
        for side in &sides {
            let passed = run.received.iter().find(|(_, r)| r.body == side.body);
            checks.check(passed.is_some(), || {
                format!("a side call of the {label} session did not reach the upstream as the harness sent it: {}", head(&side.json().to_string()))
            });
            side_indices.extend(passed.map(|(i, _)| *i));
        }
        match case.side {
            Some(marker) => {
                checks.check(sides.iter().any(|s| s.json().to_string().contains(marker)), || {
                    format!("the {label} session made no side call holding {marker:?} that passed with memory off")
                });
                for main in mains
                    .iter()
                    .filter(|m| m.json().to_string().contains(marker))
                {
                    checks.check(false, || {
                        format!("the {label} session's side call holding {marker:?} was answered with memory {:?}, not off", main.memory)
                    });
                }
            }
            None => checks.check(sides.is_empty(), || {
                format!(
                    "{} request(s) of the {label} session passed as side calls, memory off",
                    sides.len()
                )
            }),
        }
        for main in &mains {
            checks.check(main.memory == "ok", || {
                format!(
                    "a turn of the {label} session was answered with memory {:?}",
                    main.memory
                )
            });
        }
        let forwarded: Vec<&(usize, Received)> = run
            .received
            .iter()
            .filter(|(_, r)| !sides.iter().any(|s| s.body == r.body))
            .collect();
        checks.check(forwarded.len() == mains.len(), || {
            format!(
                "the {label} session sent {} turn request(s), the upstream received {}",
                mains.len(),
                forwarded.len()
            )
        });
        for (sent, (index, received)) in mains.iter().zip(&forwarded) {
            let wire = wire_of(&received.path).unwrap();
            composed(
                &case,
                &sent.json(),
                &received.json(),
                wire,
                &mut checks,
                *index,
            );
        }
        for (index, received) in &run.received {
            let body = received.json();
            let live: Vec<usize> = prompts.iter().map(|p| occurrences(&body, p)).collect();
            checks.check(live.iter().all(|&n| n <= 1) && live.contains(&1), || {
                format!("request {index} ({label} session) holds the prompts {prompts:?} {live:?} times, not the live one once")
            });
        }
        turns.push(forwarded);
    }

    let told = &turns[0];
    if case.has_tools() {
        let call = told.iter().find_map(|(index, r)| {
            let wire = wire_of(&r.path).unwrap();
            harness_call(wire, &r.json()).map(|(tool, _)| (wire, call_id(wire, *index, tool), tool))
        });
        match call {
            Some((wire, id, tool)) => {
                let output = if tool == "get_weather" {
                    "Sunny in Paris"
                } else {
                    "harness-tool-ran"
                };
                checks.check(
                    told.iter().any(|(_, r)| paired(wire, &r.json(), &id, output)),
                    || format!("no request of the first session holds the call {id} paired with its result {output:?}"),
                );
            }
            None => checks.check(false, || {
                "no request of the first session offered the harness tool the upstream calls".into()
            }),
        }
    }
    match turns[1].first() {
        Some((index, request)) => checks.check(request.text().contains(FACT), || {
            format!("request {index}, the second session's first turn, lacks the fact told in the first ({FACT:?})")
        }),
        None => checks.check(false, || "the second session made no turn request".into()),
    }

    let rows = h.rows_of(case.key, 4);
    let user = perpetuity::types::UserId::from_key(&h.state.secret.user_key(case.key, None));
    let stored = common::stored_messages(&h.state.engine.generation().memory.store, user);
    checks.check(
        stored
            .iter()
            .any(|(role, text)| *role == Role::User && text.contains(FACT)),
        || "the user's words of the first session are not stored as the user's".into(),
    );
    let said: Vec<&str> = prompts.iter().flat_map(|p| p.iter().copied()).collect();
    let systems: Vec<String> = runs
        .iter()
        .flat_map(|run| &run.sent)
        .flat_map(|t| system_texts(wire_of(&t.path).unwrap(), &t.json()))
        .map(|t| head(&t))
        .filter(|t| t.len() >= 20)
        .collect();
    let sides: Vec<String> = side_indices.iter().map(|&i| reply_text(i)).collect();
    for (role, text) in &stored {
        let foreign = case
            .context
            .iter()
            .map(|m| (*m).to_owned())
            .chain(systems.iter().cloned())
            .chain(sides.iter().cloned())
            .find(|m| text.contains(m.as_str()));
        checks.check(foreign.is_none(), || {
            format!(
                "a stored {role:?} message holds {:?}, which is no one's words: {}",
                foreign.unwrap(),
                head(text)
            )
        });
        let templated = case.template.is_some_and(|t| text.contains(t));
        if *role == Role::User && !templated {
            let words = text.trim().trim_matches('"');
            checks.check(said.iter().any(|p| p.contains(words)), || {
                format!(
                    "a stored user message is not the user's words: {}",
                    head(text)
                )
            });
        }
    }
    if let Some(template) = case.template {
        let stored_times = stored.iter().filter(|(_, t)| t.contains(template)).count();
        checks.check(stored_times <= 1, || {
            format!(
                "the template holding {template:?} is stored {stored_times} times, not at most once"
            )
        });
    }
    if case.session_header {
        for (label, run) in [("first", &runs[0]), ("second", &runs[1])] {
            let ids: Vec<&str> = run
                .sent
                .iter()
                .filter_map(|t| t.headers.get("x-session-id").and_then(|v| v.to_str().ok()))
                .collect();
            match ids.first() {
                Some(id) => {
                    let conversation = format!("session:{id}");
                    checks.check(rows.iter().any(|r| r.conversation == conversation), || {
                        format!("no row of the {label} session is stored in the conversation {conversation:?}: {:?}", rows.iter().map(|r| &r.conversation).collect::<std::collections::BTreeSet<_>>())
                    });
                }
                None => checks.check(false, || {
                    format!("the {label} session sent no x-session-id")
                }),
            }
        }
    }
    checks.finish(name);
}

const GEMINI_CONTEXT: &[&str] = &[
    "<session_context>",
    "Task Routing AI",
    "complexity_reasoning",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_cli_default_model_passes_its_router_untouched_and_keeps_its_memory() {
    let mut case = CliCase::new(
        Cli::Gemini(None),
        "gk-harness-gemini-default",
        GEMINI_CONTEXT,
    );
    case.side = Some("Task Routing AI");
    exercise_cli("gemini-cli default model", case).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_cli_flash_keeps_its_context_its_tool_loop_and_its_memory() {
    let case = CliCase::new(
        Cli::Gemini(Some("gemini-2.5-flash")),
        "gk-harness-gemini-flash",
        GEMINI_CONTEXT,
    );
    exercise_cli("gemini-cli gemini-2.5-flash", case).await;
}

/// OpenCode over `wire` under `key`: its title request is its side call.
fn opencode(wire: Wire, key: &'static str) -> CliCase {
    let mut case = CliCase::new(
        Cli::OpenCode(wire),
        key,
        &[
            "You are a title generator",
            "Generate a title for this conversation",
        ],
    );
    case.side = Some("You are a title generator");
    case.session_header = true;
    case
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_anthropic_passes_its_titles_untouched_and_keeps_its_memory() {
    exercise_cli(
        "opencode anthropic",
        opencode(Wire::Messages, "ak-harness-opencode-anthropic"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_chat_completions_passes_its_titles_untouched_and_keeps_its_memory() {
    exercise_cli(
        "opencode chat",
        opencode(Wire::Chat, "sk-harness-opencode-chat"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_responses_passes_its_titles_untouched_and_keeps_its_memory() {
    exercise_cli(
        "opencode responses",
        opencode(Wire::Responses, "sk-harness-opencode-responses"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pi_anthropic_keeps_its_context_its_tool_loop_and_its_memory() {
    exercise_cli(
        "pi anthropic",
        CliCase::new(Cli::Pi(Wire::Messages), "ak-harness-pi-anthropic", &[]),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pi_chat_completions_keeps_its_context_its_tool_loop_and_its_memory() {
    exercise_cli(
        "pi chat",
        CliCase::new(Cli::Pi(Wire::Chat), "sk-harness-pi-chat", &[]),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pi_gemini_keeps_its_context_its_tool_loop_and_its_memory() {
    exercise_cli(
        "pi gemini",
        CliCase::new(Cli::Pi(Wire::Gemini), "gk-harness-pi-gemini", &[]),
    )
    .await;
}

/// Aider over `wire` under `key`: its examples, its files message and their acknowledgements
/// are context; its edit-format reminder, appended to the user's words on Anthropic, is a
/// template there.
fn aider(wire: Wire, key: &'static str, context: &'static [&'static str]) -> CliCase {
    let mut case = CliCase::new(Cli::Aider(wire), key, context);
    case.acknowledged = Some("I have *added these files to the chat*");
    if wire == Wire::Messages {
        case.template = Some("# *SEARCH/REPLACE block* Rules:");
    }
    case
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aider_chat_completions_forwards_its_files_in_place_unremembered() {
    let context = &[
        "I have *added these files to the chat*",
        AIDER_FILE_LINE,
        "Ok, any changes I propose will be to those files.",
        "# *SEARCH/REPLACE block* Rules:",
    ];
    exercise_cli(
        "aider chat",
        aider(Wire::Chat, "sk-harness-aider-chat", context),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aider_anthropic_forwards_its_examples_and_files_in_place_unremembered() {
    let context = &[
        "I have *added these files to the chat*",
        AIDER_FILE_LINE,
        "Ok, any changes I propose will be to those files.",
        "Change get_factorial() to use math.factorial",
        "I switched to a new code base.",
    ];
    exercise_cli(
        "aider anthropic",
        aider(Wire::Messages, "ak-harness-aider-anthropic", context),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mini_swe_agent_stores_its_task_template_once_and_keeps_its_memory() {
    let mut case = CliCase::new(Cli::MiniSweAgent, "sk-harness-mini-swe-agent", &[]);
    case.template = Some("## Recommended Workflow");
    exercise_cli("mini-swe-agent", case).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pydantic_ai_chat_completions_history_loop_and_memory_work_through_the_proxy() {
    exercise_cli(
        "pydantic-ai chat",
        CliCase::new(Cli::PydanticAi(Wire::Chat), "sk-harness-pydantic-chat", &[]),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pydantic_ai_responses_history_loop_and_memory_work_through_the_proxy() {
    exercise_cli(
        "pydantic-ai responses",
        CliCase::new(
            Cli::PydanticAi(Wire::Responses),
            "sk-harness-pydantic-responses",
            &[],
        ),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pydantic_ai_anthropic_history_loop_and_memory_work_through_the_proxy() {
    exercise_cli(
        "pydantic-ai anthropic",
        CliCase::new(
            Cli::PydanticAi(Wire::Messages),
            "ak-harness-pydantic-anthropic",
            &[],
        ),
    )
    .await;
}
