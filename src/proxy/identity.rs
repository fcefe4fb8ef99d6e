//! Who is asking, and in which conversation (trust model in `docs/security.md`).
//!
//! The user is a keyed hash of the provider credential: `HMAC-SHA256(secret, credential)`,
//! optionally narrowed by the `x-perpetuity-user` header, which is hashed in under the same
//! key. The narrowing value only ever selects a sub-memory *of that credential*: no header can
//! name another credential's memory, because the credential is inside the hash. The secret is
//! 32 random bytes kept in the data directory (`secret`, mode 0600), made on first start; the
//! credential itself is never stored or logged.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::Path;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::memory::SECRET_FILE;

/// Header that narrows a credential's memory to one of its users.
pub const USER_HEADER: &str = "x-perpetuity-user";
/// Header that names the conversation.
pub const CONVERSATION_HEADER: &str = "x-perpetuity-conversation";

/// The server's keyed-hash secret.
#[derive(Clone)]
pub struct Secret([u8; 32]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// Read `<data>/secret`, or make it (32 random bytes, owner-only) when absent.
    pub fn load_or_create(data: &Path) -> std::io::Result<Self> {
        let path = data.join(SECRET_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => {
                let key: [u8; 32] = bytes.as_slice().try_into().map_err(|_| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!(
                            "{} holds {} bytes, not 32: refusing to guess the server secret",
                            path.display(),
                            bytes.len()
                        ),
                    )
                })?;
                Ok(Self(key))
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                let mut key = [0u8; 32];
                getrandom::getrandom(&mut key).map_err(|e| std::io::Error::other(e.to_string()))?;
                let mut options = std::fs::OpenOptions::new();
                options.write(true).create_new(true);
                #[cfg(unix)]
                std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
                let mut file = options.open(&path)?;
                file.write_all(&key)?;
                file.sync_all()?;
                Ok(Self(key))
            }
            Err(err) => Err(err),
        }
    }

    /// A secret from fixed bytes (tests).
    pub fn from_bytes(key: [u8; 32]) -> Self {
        Self(key)
    }

    /// The user key of `credential`, narrowed by `narrow` when given: 32 hex digits.
    pub fn user_key(&self, credential: &str, narrow: Option<&str>) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(b"credential\0");
        mac.update(credential.as_bytes());
        if let Some(narrow) = narrow {
            mac.update(b"\0user\0");
            mac.update(narrow.as_bytes());
        }
        hex(&mac.finalize().into_bytes()[..16])
    }
}

/// Group scopes: named sets of one credential's users whose memories are searched together (a
/// team of agents behind one key). A member is an `x-perpetuity-user` name; the empty name is
/// the credential's own memory (no header). Membership is by name under the asking credential:
/// the names are hashed with the credential that asks, so a group never reaches another
/// credential's memory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Groups(BTreeMap<String, BTreeSet<String>>);

impl Groups {
    /// Groups from their members' names; a group without members is refused.
    pub fn new(groups: BTreeMap<String, Vec<String>>) -> Result<Self, String> {
        let mut out = BTreeMap::new();
        for (name, members) in groups {
            if members.is_empty() {
                return Err(format!("group {name:?} has no members"));
            }
            out.insert(name, members.into_iter().collect());
        }
        Ok(Self(out))
    }

    /// The user keys whose rows a request of `credential`, narrowed by `narrow`, searches: the
    /// asker's own key first, then every other member of each group its name belongs to, in
    /// name order, each once.
    pub fn scope(&self, secret: &Secret, credential: &str, narrow: Option<&str>) -> Vec<String> {
        let name = narrow.unwrap_or("");
        let members: BTreeSet<&str> = self
            .0
            .values()
            .filter(|members| members.contains(name))
            .flatten()
            .map(String::as_str)
            .filter(|&member| member != name)
            .collect();
        std::iter::once(narrow)
            .chain(members.into_iter().map(|m| (!m.is_empty()).then_some(m)))
            .map(|member| secret.user_key(credential, member))
            .collect()
    }
}

/// A conversation's key when the harness names none: a stable hash of its first message.
pub fn conversation_key(first_message: &str) -> String {
    format!(
        "first:{}",
        hex(&Sha256::digest(first_message.as_bytes())[..8])
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_key_depends_on_credential_narrowing_and_secret() {
        let a = Secret::from_bytes([1; 32]);
        let b = Secret::from_bytes([2; 32]);
        let base = a.user_key("sk-one", None);
        assert_eq!(base, a.user_key("sk-one", None));
        assert_eq!(base.len(), 32);
        assert_ne!(base, a.user_key("sk-two", None));
        assert_ne!(base, b.user_key("sk-one", None));
        assert_ne!(base, a.user_key("sk-one", Some("alice")));
        assert_ne!(
            a.user_key("sk-one", Some("alice")),
            a.user_key("sk-two", Some("alice"))
        );
        assert!(!base.contains("sk-one"));
    }

    #[test]
    fn a_group_scope_holds_its_members_under_the_asking_credential_only() {
        let secret = Secret::from_bytes([3; 32]);
        let groups = Groups::new(BTreeMap::from([
            (
                "team".to_owned(),
                vec!["planner".to_owned(), "coder".to_owned(), String::new()],
            ),
            (
                "pair".to_owned(),
                vec!["coder".to_owned(), "reviewer".to_owned()],
            ),
        ]))
        .unwrap();
        let key = |credential: &str, name: Option<&str>| secret.user_key(credential, name);
        assert_eq!(
            groups.scope(&secret, "sk-a", Some("coder")),
            vec![
                key("sk-a", Some("coder")),
                key("sk-a", None),
                key("sk-a", Some("planner")),
                key("sk-a", Some("reviewer")),
            ]
        );
        assert_eq!(
            groups.scope(&secret, "sk-a", None),
            vec![
                key("sk-a", None),
                key("sk-a", Some("coder")),
                key("sk-a", Some("planner"))
            ]
        );
        assert_eq!(
            groups.scope(&secret, "sk-b", Some("reviewer")),
            vec![key("sk-b", Some("reviewer")), key("sk-b", Some("coder"))]
        );
        assert_eq!(
            groups.scope(&secret, "sk-a", Some("outsider")),
            vec![key("sk-a", Some("outsider"))]
        );
        assert!(Groups::new(BTreeMap::from([("empty".to_owned(), Vec::new())])).is_err());
    }

    #[test]
    fn the_secret_is_made_once_and_then_kept() {
        let dir = tempfile::tempdir().unwrap();
        let first = Secret::load_or_create(dir.path()).unwrap();
        let again = Secret::load_or_create(dir.path()).unwrap();
        assert_eq!(first.user_key("k", None), again.user_key("k", None));
        std::fs::write(dir.path().join(SECRET_FILE), b"short").unwrap();
        let err = Secret::load_or_create(dir.path()).unwrap_err();
        assert!(err.to_string().contains("not 32"), "{err}");
    }
}
