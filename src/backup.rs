//! Online backup and restore of a data directory.
//!
//! A backup is a folder holding `store/` (a RocksDB checkpoint of the store, taken while it
//! keeps serving: table files hard-linked where the backup is on the same file system, copied
//! otherwise), `dictionaries/<version>/` for each version the store names (serving, and dark
//! during a swap; linked or copied the same way, since a version's files never change), the
//! server secret that keys credentials to users, and `backup.json`. It is
//! made in `<DEST>.partial` and renamed to `DEST` when whole, so a `DEST` that exists is a
//! whole backup. The arena is not in it: it is derived from the store, and the first open of
//! a restored data directory builds it.
//!
//! A restore makes a new data directory from a backup the same way (`<DATA>.partial`, then one
//! rename): table files and dictionaries hard-linked where the file system allows (RocksDB
//! never changes a table file; it only unlinks it), every other file copied, the dictionaries
//! put where `dict install` uploads them, so the restored
//! directory serves without the dictionaries root the backup came from.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::dictionary::BadVersion;
use crate::memory::{self, LISTENING_FILE, Memory, SECRET_FILE};
use crate::store::{FORMAT_VERSION, OLDEST_FORMAT_VERSION, StoreError};
use crate::types::now_ms;

/// The backup's folder holding the store's checkpoint.
const STORE_DIR: &str = "store";
/// The manifest, written last.
pub const MANIFEST_FILE: &str = "backup.json";
/// The manifest format this build writes and reads.
const FORMAT: u32 = 1;

/// What a backup holds, as `backup.json` records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// The manifest format ([`FORMAT`]).
    pub format: u32,
    /// The store format of the checkpoint ([`FORMAT_VERSION`]).
    pub store_format: u32,
    /// When the backup began, in Unix milliseconds.
    pub taken_at_ms: i64,
    /// Every row below this id was stored before the backup began, and is in it.
    pub rows_below: u64,
    /// The serving dictionary version.
    pub serving: String,
    /// The dark version installed at the time, if any.
    pub dark: Option<String>,
    /// How long the backup took.
    pub elapsed_ms: u64,
}

/// A backup or a restore could not be made.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// Class: internal (see [`StoreError`]).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Class: client. A backup or a restore writes a new folder, never into an old one.
    #[error("{0} exists already: a backup and a restore each write a new folder")]
    Exists(PathBuf),
    /// Class: client. The folder given is not a backup this build can restore.
    #[error("{path} is not a backup this build can restore: {reason}")]
    NotABackup { path: PathBuf, reason: String },
    /// Class: client. A dictionary version in the manifest cannot name a folder.
    #[error(transparent)]
    Version(#[from] BadVersion),
    /// Class: client or internal. The server holding the data directory could not be asked,
    /// or refused.
    #[error("asking the server that holds {data} for the backup: {reason}")]
    Server { data: PathBuf, reason: String },
    /// Class: internal. Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

/// An I/O error's mapping to [`BackupError::Io`] at `path`.
fn at(path: &Path) -> impl FnOnce(io::Error) -> BackupError + '_ {
    move |source| BackupError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Take a backup of `memory`, serving or not, into the new folder `to`.
pub fn backup(memory: &Memory, to: &Path) -> Result<Manifest, BackupError> {
    let started = Instant::now();
    let taken_at_ms = now_ms();
    let partial = begin(to)?;
    let store = &memory.store;
    let rows_below = store.checkpoint(&partial.join(STORE_DIR))?.0;
    let dark = store.dark_dictionary();
    for dictionary in std::iter::once(&memory.dictionary).chain(&dark) {
        let target = memory::upload_dir(&partial, dictionary.version())?;
        copy_folder(dictionary.dir(), &target, always).map_err(at(&target))?;
    }
    copy_secret(store.path(), &partial)?;
    let manifest = Manifest {
        format: FORMAT,
        store_format: FORMAT_VERSION,
        taken_at_ms,
        rows_below,
        serving: memory.dictionary.version().to_owned(),
        dark: dark.map(|dictionary| dictionary.version().to_owned()),
        elapsed_ms: started.elapsed().as_millis() as u64,
    };
    let path = partial.join(MANIFEST_FILE);
    let bytes = serde_json::to_vec_pretty(&manifest).expect("a manifest serialises");
    std::fs::write(&path, bytes).map_err(at(&path))?;
    sync(&path)?;
    finish(&partial, to)?;
    Ok(manifest)
}

/// How long `perpetuity backup` waits to connect to the server that holds the store.
const SERVER_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long `perpetuity backup` waits for that server's answer: a backup of hard links takes
/// seconds, its flush a little more.
const SERVER_BACKUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// Ask the server holding data directory `data` (at the address in its [`LISTENING_FILE`])
/// for a backup into the new folder `to` (`POST /admin/backup`, with the admin `token`), and
/// return the manifest it answers with. `to` is made absolute first: the server resolves it.
pub fn backup_through_server(data: &Path, to: &Path, token: &str) -> Result<Manifest, BackupError> {
    use std::io::{Read as _, Write as _};
    let failed = |reason: String| BackupError::Server {
        data: data.to_path_buf(),
        reason,
    };
    if token.chars().any(char::is_control) {
        return Err(failed("the admin token holds a control character".into()));
    }
    let to = std::path::absolute(to).map_err(at(to))?;
    let listening = data.join(LISTENING_FILE);
    let address = std::fs::read_to_string(&listening).map_err(|err| {
        failed(format!(
            "the store is held by another process, and {} cannot be read ({err}); is it a \
             `perpetuity serve` of this build?",
            listening.display()
        ))
    })?;
    let address: std::net::SocketAddr = address
        .trim()
        .parse()
        .map_err(|err| failed(format!("{}: {err}", listening.display())))?;
    let address = match address.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => {
            (std::net::Ipv4Addr::LOCALHOST, address.port()).into()
        }
        ip if ip.is_unspecified() => (std::net::Ipv6Addr::LOCALHOST, address.port()).into(),
        _ => address,
    };
    let path = to
        .to_str()
        .ok_or_else(|| failed(format!("{} is not UTF-8", to.display())))?;
    let request = format!(
        "POST /admin/backup?path={} HTTP/1.1\r\nhost: {address}\r\nx-perpetuity-admin-token: \
         {token}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        percent_encoded(path)
    );
    let mut stream = std::net::TcpStream::connect_timeout(&address, SERVER_CONNECT_TIMEOUT)
        .map_err(|err| failed(format!("connecting to {address}: {err}")))?;
    let mut answer = Vec::new();
    stream
        .set_read_timeout(Some(SERVER_BACKUP_TIMEOUT))
        .and_then(|()| stream.write_all(request.as_bytes()))
        .and_then(|()| stream.read_to_end(&mut answer))
        .map_err(|err| failed(format!("talking to {address}: {err}")))?;
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or_else(|| failed(format!("{address} answered no HTTP response")))?;
    if !head.starts_with("HTTP/1.1 200") {
        let status = head.lines().next().unwrap_or_default();
        return Err(failed(format!(
            "{address} answered {status}: {}",
            body.trim()
        )));
    }
    serde_json::from_str(body).map_err(|err| failed(format!("{address} answered {err}: {body}")))
}

/// `text` percent-encoded for a query parameter: every byte but the unreserved ones.
fn percent_encoded(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~/".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Make the new data directory `data` from the backup in `from`; returns its manifest. The
/// store is not opened here: the caller opens it (building its arena) and checks it.
pub fn restore(from: &Path, data: &Path) -> Result<Manifest, BackupError> {
    let manifest = read_manifest(from)?;
    let partial = begin(data)?;
    copy_folder(&from.join(STORE_DIR), &partial, is_table).map_err(at(&partial))?;
    for version in std::iter::once(&manifest.serving).chain(&manifest.dark) {
        let source = memory::upload_dir(from, version)?;
        let target = memory::upload_dir(&partial, version)?;
        copy_folder(&source, &target, always).map_err(at(&target))?;
    }
    copy_secret(from, &partial)?;
    finish(&partial, data)?;
    Ok(manifest)
}

/// Read and check the manifest of the backup in `from`.
pub fn read_manifest(from: &Path) -> Result<Manifest, BackupError> {
    let not_a_backup = |reason: String| BackupError::NotABackup {
        path: from.to_path_buf(),
        reason,
    };
    let path = from.join(MANIFEST_FILE);
    let bytes =
        std::fs::read(&path).map_err(|err| not_a_backup(format!("{MANIFEST_FILE}: {err}")))?;
    let manifest: Manifest = serde_json::from_slice(&bytes)
        .map_err(|err| not_a_backup(format!("{MANIFEST_FILE}: {err}")))?;
    if manifest.format != FORMAT {
        return Err(not_a_backup(format!(
            "backup format {} (this build reads {FORMAT})",
            manifest.format
        )));
    }
    if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&manifest.store_format) {
        return Err(not_a_backup(format!(
            "store format {} (this build reads {OLDEST_FORMAT_VERSION} to {FORMAT_VERSION})",
            manifest.store_format
        )));
    }
    if !from.join(STORE_DIR).is_dir() {
        return Err(not_a_backup(format!("no {STORE_DIR}/ folder")));
    }
    Ok(manifest)
}

/// The file that marks a folder as a backup's or a restore's work in progress: only a leftover
/// holding it is removed when the next one begins.
const PARTIAL_MARKER: &str = ".perpetuity-partial";

/// The folder a backup or a restore into `target` is made in, `<target>.partial`: made new and
/// private in one step (never through a link left in its place), holding [`PARTIAL_MARKER`]. A
/// leftover of one that stopped (a real folder holding the marker) is removed first; anything
/// else there is refused, never removed. `target` itself must not exist, or be an empty folder.
fn begin(target: &Path) -> Result<PathBuf, BackupError> {
    let is_folder =
        |path: &Path| std::fs::symlink_metadata(path).is_ok_and(|meta| meta.file_type().is_dir());
    match std::fs::read_dir(target).map(|mut entries| entries.next().is_none()) {
        Ok(true) if is_folder(target) => std::fs::remove_dir(target).map_err(at(target))?,
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        _ => return Err(BackupError::Exists(target.to_path_buf())),
    }
    let mut name = target
        .file_name()
        .ok_or_else(|| BackupError::Exists(target.to_path_buf()))?
        .to_os_string();
    name.push(".partial");
    let partial = target.with_file_name(name);
    if std::fs::symlink_metadata(&partial).is_ok() {
        if !(is_folder(&partial) && partial.join(PARTIAL_MARKER).is_file()) {
            return Err(BackupError::Exists(partial));
        }
        std::fs::remove_dir_all(&partial).map_err(at(&partial))?;
    }
    if let Some(parent) = partial.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(at(parent))?;
    }
    {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&partial)
            .map_err(at(&partial))?;
    }
    std::fs::write(partial.join(PARTIAL_MARKER), b"").map_err(at(&partial))?;
    Ok(partial)
}

/// Sync `partial`'s folders and rename it to `target`, then sync `target`'s parent so the
/// rename itself survives a crash.
fn finish(partial: &Path, target: &Path) -> Result<(), BackupError> {
    std::fs::remove_file(partial.join(PARTIAL_MARKER)).map_err(at(partial))?;
    for entry in walk(partial)? {
        if entry.is_dir() {
            sync(&entry)?;
        }
    }
    sync(partial)?;
    std::fs::rename(partial, target).map_err(at(target))?;
    let parent = match target.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    sync(parent)
}

/// Every folder under `dir`, deepest first.
fn walk(dir: &Path) -> Result<Vec<PathBuf>, BackupError> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(at(dir))? {
        let path = entry.map_err(at(dir))?.path();
        if path.is_dir() {
            found.extend(walk(&path)?);
            found.push(path);
        }
    }
    Ok(found)
}

/// Copy every file of folder `source` into folder `target` (made when missing), each synced;
/// a file `link` says is never changed once written (a RocksDB table file, a dictionary's) is
/// hard-linked instead where the file system allows. Returns the files copied or linked; an
/// error names the file it met.
pub fn copy_folder(source: &Path, target: &Path, link: fn(&Path) -> bool) -> io::Result<u64> {
    let named = |path: &Path| {
        let path = path.display().to_string();
        move |err: io::Error| io::Error::new(err.kind(), format!("{path}: {err}"))
    };
    std::fs::create_dir_all(target).map_err(named(target))?;
    let mut files = 0;
    for entry in std::fs::read_dir(source).map_err(named(source))? {
        let from = entry.map_err(named(source))?.path();
        if !from.is_file() {
            continue;
        }
        let to = target.join(from.file_name().expect("a listed file has a name"));
        if !(link(&from) && std::fs::hard_link(&from, &to).is_ok()) {
            std::fs::copy(&from, &to).map_err(named(&to))?;
            std::fs::File::open(&to)
                .and_then(|file| file.sync_all())
                .map_err(named(&to))?;
        }
        files += 1;
    }
    Ok(files)
}

/// A RocksDB table file (`.sst`, `.blob`): RocksDB never changes one once written, only
/// unlinks it, so a restored store may share it with the backup.
fn is_table(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("sst" | "blob")
    )
}

/// Every file: a dictionary version's files never change (a new version is a new folder).
fn always(_: &Path) -> bool {
    true
}

/// No file: a copy that owns its bytes.
pub fn never(_: &Path) -> bool {
    false
}

/// Copy the server secret of folder `from` into folder `to`, owner-only, when there is one
/// (a data directory only ever used from the command line has none).
fn copy_secret(from: &Path, to: &Path) -> Result<(), BackupError> {
    use std::os::unix::fs::PermissionsExt as _;
    let (source, target) = (from.join(SECRET_FILE), to.join(SECRET_FILE));
    match std::fs::copy(&source, &target) {
        Ok(_) => {
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600))
                .map_err(at(&target))?;
            sync(&target)
        }
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(at(&source)(err)),
    }
}

/// fsync a file or a folder.
fn sync(path: &Path) -> Result<(), BackupError> {
    std::fs::File::open(path)
        .and_then(|file| file.sync_all())
        .map_err(at(path))
}
