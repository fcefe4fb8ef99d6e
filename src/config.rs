//! Configuration defaults: one place for every path and limit the binary starts with.

use std::net::SocketAddr;
use std::path::PathBuf;

use sha2::{Digest, Sha256};

/// Where `serve` listens when not told otherwise: loopback only, so a fresh start exposes
/// nothing beyond this machine.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8787";

/// The data directory when not told otherwise (created if missing).
pub const DEFAULT_DATA_DIR: &str = "perpetuity-data";

/// The folder holding `dictionaries/<version>/`: `$PERPETUITY_DICTIONARIES`, else the
/// `dictionaries/` folder of the source tree this binary was built from.
pub fn default_dictionaries_root() -> PathBuf {
    std::env::var_os("PERPETUITY_DICTIONARIES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/dictionaries")))
}

/// The token the admin endpoints require. It never prints (its `Debug` is `[redacted]`, so
/// neither does a configuration holding it) and is compared in constant time
/// ([`AdminToken::matches`]).
#[derive(Clone, serde::Deserialize)]
#[serde(transparent)]
pub struct AdminToken(String);

impl AdminToken {
    /// The token itself, for a client that sends it (`perpetuity backup` asking a server).
    /// Never logged: `Debug` prints it redacted.
    pub fn reveal(&self) -> &str {
        &self.0
    }

    /// Whether no token was given (the admin endpoints then stay disabled).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `given` is this token, in a time that tells nothing of where the two differ or
    /// of how long `given` should be: both are hashed (SHA-256) and the digests compared
    /// whole, every byte visited.
    pub fn matches(&self, given: &str) -> bool {
        let (ours, theirs) = (Sha256::digest(&self.0), Sha256::digest(given));
        let differ = ours
            .iter()
            .zip(theirs.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        std::hint::black_box(differ) == 0
    }
}

impl From<String> for AdminToken {
    fn from(token: String) -> Self {
        Self(token)
    }
}

impl From<&str> for AdminToken {
    fn from(token: &str) -> Self {
        Self(token.to_owned())
    }
}

impl PartialEq for AdminToken {
    fn eq(&self, other: &Self) -> bool {
        self.matches(&other.0)
    }
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken([redacted])")
    }
}

/// What `serve` needs to start.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub dictionaries_root: PathBuf,
}

/// `perpetuity serve`'s settings file (TOML, `--config PATH` or `$PERPETUITY_CONFIG`). Every
/// key is optional; a key the command line or the environment also sets is overridden by them
/// (command line, then environment, then this file, then the built-in defaults). Unknown keys
/// are refused, so a misspelt setting is an error instead of a silent default.
/// README.md ("Configuration") lists every key.
#[derive(Debug, Default, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub listen: Option<SocketAddr>,
    pub data: Option<PathBuf>,
    pub dictionaries: Option<PathBuf>,
    pub dictionary_version: Option<String>,
    pub sync_writes: Option<bool>,
    pub uncompressed: Option<bool>,
    pub scalar_kernels: Option<bool>,
    pub admin_token: Option<AdminToken>,
    pub max_concurrent: Option<usize>,
    pub memory_tools: Option<bool>,
    pub tool_rounds: Option<usize>,
    /// `[groups]`: group scopes, each a name and its members' `x-perpetuity-user` names (`""`
    /// for a credential's own memory).
    #[serde(default)]
    pub groups: std::collections::BTreeMap<String, Vec<String>>,
    #[serde(default)]
    pub upstreams: UpstreamsFile,
    #[serde(default)]
    pub limits: LimitsFile,
    #[serde(default)]
    pub recall: RecallFile,
    #[serde(default)]
    pub inspector: InspectorFile,
}

/// `[inspector]`: who may use the inspector, and the log of recent requests it shows (in
/// memory only).
#[derive(Debug, Default, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InspectorFile {
    /// Who may use it [default: credentials].
    pub access: Option<InspectorAccess>,
    /// Requests kept per user (0: none).
    pub recent_requests: Option<usize>,
    /// Bytes kept over all users.
    pub recent_bytes: Option<usize>,
}

/// Who may use the inspector (`docs/proxy.md`, "Inspector").
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InspectorAccess {
    /// No one: every inspector path answers 404.
    Off,
    /// The operator only, by the admin token.
    Operator,
    /// The operator, and each credential the provider vouched for, for its own memory.
    #[default]
    Credentials,
}

/// `[upstreams]`: each provider's API base URL.
#[derive(Debug, Default, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamsFile {
    pub openai: Option<String>,
    pub anthropic: Option<String>,
    pub gemini: Option<String>,
}

/// `[limits]`: the limits of one request, in bytes and seconds.
#[derive(Debug, Default, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsFile {
    pub body_limit_bytes: Option<usize>,
    pub upstream_timeout_s: Option<u64>,
    pub stream_idle_timeout_s: Option<u64>,
    pub connect_timeout_s: Option<u64>,
    pub header_timeout_s: Option<u64>,
    pub body_timeout_s: Option<u64>,
}

/// `[recall]`: how much memory each request recalls and renders.
#[derive(Debug, Default, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecallFile {
    pub budget_floor_tokens: Option<usize>,
    pub budget_ceiling_tokens: Option<usize>,
    pub depth: Option<usize>,
    pub reach: Option<usize>,
    pub conversation_lift: Option<f32>,
    pub speaker_lift: Option<f32>,
    pub model_weight: Option<f32>,
    pub mandatory_hits: Option<usize>,
    pub recent_tokens: Option<usize>,
    pub session_tokens: Option<usize>,
    pub session_share: Option<f32>,
    pub warm_floor: Option<f32>,
}

impl FileConfig {
    /// Read and check the file at `path`: a TOML error names the line, a value out of range
    /// names the key.
    pub fn load(path: &std::path::Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("reading the config file {}: {e}", path.display()))?;
        let config: Self = toml::from_str(&text)
            .map_err(|e| anyhow::anyhow!("config file {}: {e}", path.display()))?;
        config
            .check()
            .map_err(|e| anyhow::anyhow!("config file {}: {e}", path.display()))?;
        Ok(config)
    }

    fn check(&self) -> Result<(), String> {
        for (name, url) in [
            ("upstreams.openai", &self.upstreams.openai),
            ("upstreams.anthropic", &self.upstreams.anthropic),
            ("upstreams.gemini", &self.upstreams.gemini),
        ] {
            if let Some(url) = url {
                check_upstream_url(url).map_err(|e| format!("{name}: {e}"))?;
            }
        }
        let positive = [
            ("max_concurrent", self.max_concurrent.map(|n| n as u64)),
            ("tool_rounds", self.tool_rounds.map(|n| n as u64)),
            (
                "limits.body_limit_bytes",
                self.limits.body_limit_bytes.map(|n| n as u64),
            ),
            ("limits.upstream_timeout_s", self.limits.upstream_timeout_s),
            (
                "limits.stream_idle_timeout_s",
                self.limits.stream_idle_timeout_s,
            ),
            ("limits.connect_timeout_s", self.limits.connect_timeout_s),
            ("limits.header_timeout_s", self.limits.header_timeout_s),
            ("limits.body_timeout_s", self.limits.body_timeout_s),
            ("recall.depth", self.recall.depth.map(|n| n as u64)),
            ("recall.reach", self.recall.reach.map(|n| n as u64)),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, value)| *value == Some(0)) {
            return Err(format!("{name} must be above 0"));
        }
        for (name, share) in [
            ("recall.warm_floor", self.recall.warm_floor),
            ("recall.model_weight", self.recall.model_weight),
            ("recall.session_share", self.recall.session_share),
        ] {
            if let Some(share) = share
                && !(0.0..=1.0).contains(&share)
            {
                return Err(format!("{name} must lie in 0..=1, not {share}"));
            }
        }
        for (name, lift) in [
            ("recall.conversation_lift", self.recall.conversation_lift),
            ("recall.speaker_lift", self.recall.speaker_lift),
        ] {
            if let Some(lift) = lift
                && !(lift.is_finite() && lift >= 0.0)
            {
                return Err(format!(
                    "{name} must be a finite number of at least 0, not {lift}"
                ));
            }
        }
        Ok(())
    }
}

/// An upstream base URL must be `http://` or `https://` (plain HTTP for local upstreams).
pub fn check_upstream_url(url: &str) -> Result<(), String> {
    if url.starts_with("http://") || url.starts_with("https://") {
        Ok(())
    } else {
        Err(format!("{url:?} is not an http:// or https:// URL"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::ProxyConfig;

    #[test]
    fn a_full_file_sets_every_key() {
        let file: FileConfig = toml::from_str(
            r#"
            listen = "127.0.0.1:9000"
            data = "/srv/memory"
            dictionaries = "/srv/dictionaries"
            dictionary_version = "v1"
            sync_writes = true
            uncompressed = true
            scalar_kernels = false
            admin_token = "operator"
            max_concurrent = 64
            memory_tools = false
            tool_rounds = 3

            [upstreams]
            openai = "http://127.0.0.1:1"
            anthropic = "https://anthropic.internal"
            gemini = "http://127.0.0.1:3"

            [limits]
            body_limit_bytes = 1048576
            upstream_timeout_s = 60
            stream_idle_timeout_s = 90
            connect_timeout_s = 5
            header_timeout_s = 7

            [recall]
            budget_floor_tokens = 1000
            budget_ceiling_tokens = 4000
            depth = 50
            reach = 300
            conversation_lift = 0.5
            speaker_lift = 0.1
            model_weight = 0.9
            mandatory_hits = 2
            recent_tokens = 500
            session_tokens = 12000
            session_share = 0.4
            warm_floor = 0.1

            [groups]
            team = ["planner", "coder", ""]

            [inspector]
            access = "operator"
            "#,
        )
        .unwrap();
        file.check().unwrap();
        let proxy = ProxyConfig::from_file(&file).unwrap();
        assert_eq!(file.listen, Some("127.0.0.1:9000".parse().unwrap()));
        assert_eq!(file.max_concurrent, Some(64));
        assert_eq!(file.uncompressed, Some(true));
        assert_eq!(file.memory_tools, Some(false));
        assert_eq!(file.tool_rounds, Some(3));
        assert_eq!(proxy.openai, "http://127.0.0.1:1");
        assert_eq!(proxy.anthropic, "https://anthropic.internal");
        assert_eq!(proxy.gemini, "http://127.0.0.1:3");
        assert_eq!(proxy.body_limit, 1_048_576);
        assert_eq!(proxy.upstream_timeout.as_secs(), 60);
        assert_eq!(proxy.stream_idle_timeout.as_secs(), 90);
        assert_eq!(proxy.connect_timeout.as_secs(), 5);
        assert_eq!(proxy.header_timeout.as_secs(), 7);
        assert_eq!(proxy.recall.budget.floor, 1_000);
        assert_eq!(proxy.recall.budget.ceiling, 4_000);
        assert_eq!(proxy.recall.depth, 50);
        assert_eq!(proxy.recall.reach, 300);
        assert_eq!(proxy.recall.conversation_lift, 0.5);
        assert_eq!(proxy.recall.speaker_lift, 0.1);
        assert_eq!(proxy.recall.model_weight, 0.9);
        assert_eq!(proxy.recall.mandatory_hits, 2);
        assert_eq!(proxy.inspector, crate::config::InspectorAccess::Operator);
        assert_eq!(proxy.recall.recent_tokens, 500);
        assert_eq!(proxy.recall.session_tokens, 12_000);
        assert_eq!(proxy.recall.session_share, 0.4);
        assert_eq!(proxy.recall.warm_floor, 0.1);
        let secret = crate::proxy::identity::Secret::from_bytes([1; 32]);
        let key = |name| secret.user_key("sk", name);
        assert_eq!(
            proxy.groups.scope(&secret, "sk", Some("coder")),
            vec![key(Some("coder")), key(None), key(Some("planner"))]
        );
    }

    #[test]
    fn the_admin_token_never_prints_and_matches_itself_only() {
        const TOKEN: &str = "operator-7f3a9e";
        let config = ProxyConfig {
            admin_token: Some(TOKEN.into()),
            ..ProxyConfig::default()
        };
        let printed = format!("{config:?}");
        assert!(!printed.contains(TOKEN), "{printed}");
        assert!(printed.contains("[redacted]"), "{printed}");
        let file: FileConfig = toml::from_str(&format!("admin_token = \"{TOKEN}\"")).unwrap();
        assert!(!format!("{file:?}").contains(TOKEN));
        assert_eq!(file.admin_token, config.admin_token);
        let token = AdminToken::from(TOKEN);
        assert!(token.matches(TOKEN));
        for wrong in [
            "",
            "operator-7f3a9f",
            "operator-7f3a9",
            "operator-7f3a9ee",
            "x",
        ] {
            assert!(!token.matches(wrong), "{wrong}");
        }
    }

    #[test]
    fn an_empty_file_changes_nothing() {
        let file: FileConfig = toml::from_str("").unwrap();
        let proxy = ProxyConfig::from_file(&file).unwrap();
        let default = ProxyConfig::default();
        assert_eq!(proxy.openai, default.openai);
        assert_eq!(proxy.body_limit, default.body_limit);
        assert_eq!(proxy.recall.budget, default.recall.budget);
    }

    #[test]
    fn bad_files_are_refused_with_the_key() {
        let refused = |text: &str| {
            toml::from_str::<FileConfig>(text)
                .map_err(|e| e.to_string())
                .and_then(|file| file.check().map(|()| file))
                .and_then(|file| ProxyConfig::from_file(&file).map(drop))
                .expect_err(text)
        };
        assert!(refused("lisen = \"127.0.0.1:1\"").contains("lisen"));
        assert!(refused("[recall]\ndepht = 3").contains("depht"));
        assert!(refused("max_concurrent = \"many\"").contains("max_concurrent"));
        assert!(refused("[upstreams]\nopenai = \"ftp://x\"").contains("upstreams.openai"));
        assert!(refused("[limits]\nconnect_timeout_s = 0").contains("connect_timeout_s"));
        assert!(refused("[recall]\nwarm_floor = 2.0").contains("warm_floor"));
        assert!(refused("[recall]\nspeaker_lift = -0.1").contains("speaker_lift"));
        assert!(refused("[recall]\nmodel_weight = 1.5").contains("model_weight"));
        assert!(refused("[recall]\nmodel_weight = nan").contains("model_weight"));
        assert!(refused("[recall]\nsession_share = 1.5").contains("session_share"));
        assert!(refused("[recall]\nconversation_lift = nan").contains("conversation_lift"));
        assert!(refused("[recall]\nreach = 0").contains("recall.reach"));
        assert!(
            refused("[recall]\nbudget_floor_tokens = 9000\nbudget_ceiling_tokens = 100")
                .contains("floor")
        );
        assert!(refused("[groups]\nteam = []").contains("team"));
        assert!(refused("[groups]\nteam = \"coder\"").contains("team"));
    }
}
