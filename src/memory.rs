//! A memory: the store in a data directory together with the dictionary it serves.
//!
//! The serving version is recorded in the store (meta `dictionary_version`): a new store
//! records the version it is first opened with (the requested one, else
//! [`DEFAULT_VERSION`]); afterwards the recorded version serves, and a request for another one
//! is refused (changing it is the hot swap's flip, `crate::swap`). A version is loaded from
//! the data directory's uploads (`<data>/dictionaries/<version>/`, where `dict install`
//! puts it) when it is there, else from the dictionaries root.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::dictionary::{BadVersion, DEFAULT_VERSION, Dictionary, DictionaryError, check_version};
use crate::store::{Store, StoreError, StoreOptions};

/// Why a data directory could not be opened: its store, or a dictionary it serves or has
/// installed. The crate's [`crate::error::Error`] takes either variant as its own.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Dictionary(#[from] DictionaryError),
}

/// File name of the server secret inside the data directory (`proxy::identity` keys
/// credentials with it; a backup carries it, so a restored server keys them alike).
pub const SECRET_FILE: &str = "secret";

/// File name of the address a serving process listens on, inside its data directory: written
/// once it listens, removed when it stops, read by `perpetuity backup` to ask that server for
/// a backup of the store it holds.
pub const LISTENING_FILE: &str = "listening";

/// The folder of the dictionaries uploaded into data directory `data`.
pub fn uploads_dir(data: &Path) -> PathBuf {
    data.join("dictionaries")
}

/// The folder of dictionary `version` uploaded into data directory `data`; refused for a
/// version that cannot name a folder ([`check_version`]).
pub fn upload_dir(data: &Path, version: &str) -> Result<PathBuf, BadVersion> {
    Ok(uploads_dir(data).join(check_version(version)?))
}

/// Load dictionary `version`: uploaded into `data`, else from `root`.
pub fn load_dictionary(
    data: &Path,
    root: &Path,
    version: &str,
) -> Result<Dictionary, DictionaryError> {
    let uploaded = upload_dir(data, version)?;
    if uploaded.is_dir() {
        Dictionary::load(&uploaded)
    } else {
        Dictionary::load_version(root, version)
    }
}

/// An opened data directory and its serving dictionary.
#[derive(Debug, Clone)]
pub struct Memory {
    pub store: Arc<Store>,
    pub dictionary: Arc<Dictionary>,
}

impl Memory {
    /// Open (or create) the store in `data` with its serving dictionary (the recorded version;
    /// `requested` for a new store, refused when it differs from the recorded one), and attach
    /// the table of an installed dark version.
    pub fn open(
        data: &Path,
        dictionaries_root: &Path,
        requested: Option<&str>,
        options: &StoreOptions,
    ) -> Result<Self, OpenError> {
        let store = Store::open(data, options)?;
        let version = match store.dictionary_version()? {
            Some(recorded) => {
                if let Some(requested) = requested {
                    store.bind_dictionary(requested)?;
                }
                recorded
            }
            None => requested.unwrap_or(DEFAULT_VERSION).to_owned(),
        };
        let dictionary = Arc::new(load_dictionary(data, dictionaries_root, &version)?);
        store.bind_dictionary(dictionary.version())?;
        if let Some(dark) = store.dark()? {
            let table = load_dictionary(data, dictionaries_root, &dark.version)?;
            store.attach_dark(Arc::new(table))?;
        }
        Ok(Self {
            store: Arc::new(store),
            dictionary,
        })
    }
}
