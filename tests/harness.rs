//! Real agent harnesses through the proxy: Claude Code and Codex as their own CLIs,
//! openai-node and the AI SDK (`tests/harness/node_clients.mjs`), openai-agents, langchain and
//! litellm (`tests/harness/py_clients.py`), at the versions `tools/install-deps.sh` pins. Each
//! runs its own tool loop against the proxy, in front of an upstream that answers every request
//! from its content: a call of the harness's tool while the request carries no tool result,
//! then text. Per client, in two separate sessions (the second with an image):
//!
//! - the reply reaches the client byte for byte;
//! - the loop's call and result reach the upstream paired;
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
const HARNESS_TOOLS: [(&str, &str); 3] = [
    (
        "Bash",
        r#"{"command":"echo harness-tool-ran","description":"Print a marker"}"#,
    ),
    ("exec_command", r#"{"cmd":"echo harness-tool-ran"}"#),
    ("get_weather", r#"{"zone":"CET","city":"Paris"}"#),
];
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

/// The names of a request's tools, in any of the three formats.
fn tool_names(body: &Value) -> Vec<&str> {
    body["tools"]
        .as_array()
        .into_iter()
        .flatten()
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

/// Where the pinned clients are: the npm prefix and the Python.
struct Installed {
    npm: PathBuf,
    python: PathBuf,
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

/// A request's conversation list (Messages and Chat `messages`, Responses `input` as items).
fn conversation(wire: Wire, body: &Value) -> Vec<Value> {
    match wire {
        Wire::Messages | Wire::Chat => body["messages"].as_array().cloned().unwrap_or_default(),
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
    for key in ["system", "instructions", "tools"] {
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

/// Whether the request holds the call `id` followed by its result, which says `output`.
fn paired(wire: Wire, body: &Value, id: &str, output: &str) -> bool {
    let items = conversation(wire, body);
    let call = items.iter().position(|item| match wire {
        Wire::Messages => item["content"]
            .as_array()
            .is_some_and(|b| b.iter().any(|b| b["type"] == "tool_use" && b["id"] == id)),
        Wire::Responses => item["type"] == "function_call" && item["call_id"] == id,
        Wire::Chat => item["tool_calls"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["id"] == id)),
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

    for (label, session) in [("first", &told), ("second", &asked)] {
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
        let id = match wire {
            Wire::Messages => format!("toolu_harness_{first}"),
            Wire::Responses | Wire::Chat => format!("call_harness_{first}"),
        };
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
