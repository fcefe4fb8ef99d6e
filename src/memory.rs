//! A memory: the store in a data directory together with the dictionary it serves.

use std::path::Path;

use crate::dictionary::Dictionary;
use crate::error::Error;
use crate::store::{Store, StoreOptions};

/// An opened data directory and its serving dictionary.
#[derive(Debug)]
pub struct Memory {
    pub store: Store,
    pub dictionary: Dictionary,
}

impl Memory {
    /// Load dictionary `version` from `dictionaries_root`, open (or create) the store in `data`,
    /// and bind the store to that version (refused if the store serves another).
    pub fn open(
        data: &Path,
        dictionaries_root: &Path,
        version: &str,
        options: &StoreOptions,
    ) -> Result<Self, Error> {
        let dictionary = Dictionary::load_version(dictionaries_root, version)?;
        let store = Store::open(data, options)?;
        store.bind_dictionary(dictionary.version())?;
        Ok(Self { store, dictionary })
    }
}
