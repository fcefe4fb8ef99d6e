//! The crate's error, composed from each module's own.

use crate::arena::ArenaError;
use crate::backup::BackupError;
use crate::datasets::DatasetError;
use crate::dictionary::DictionaryError;
use crate::ingest::ExportError;
use crate::memory::OpenError;
use crate::store::StoreError;

/// Every error a library entry point can return; each variant keeps its module's error whole.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Class: corruption or configuration (see [`DictionaryError`]).
    #[error(transparent)]
    Dictionary(#[from] DictionaryError),
    /// Class: internal or corruption (see [`StoreError`]).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Class: client (a bad input file).
    #[error(transparent)]
    Dataset(#[from] DatasetError),
    /// Class: internal or corruption.
    #[error(transparent)]
    Export(#[from] ExportError),
    /// Class: internal or configuration (see [`ArenaError`]).
    #[error(transparent)]
    Arena(#[from] ArenaError),
    /// Class: client or internal (see [`BackupError`]).
    #[error(transparent)]
    Backup(#[from] BackupError),
}

impl From<OpenError> for Error {
    fn from(error: OpenError) -> Self {
        match error {
            OpenError::Store(store) => Self::Store(store),
            OpenError::Dictionary(dictionary) => Self::Dictionary(dictionary),
        }
    }
}

impl Error {
    /// A dictionary swap step refused in the store's present state (class: client).
    pub fn is_swap_refusal(&self) -> bool {
        matches!(self, Error::Store(StoreError::Swap { .. }))
    }

    /// A backup's destination that is there already (class: client).
    pub fn is_existing_destination(&self) -> bool {
        matches!(self, Error::Backup(BackupError::Exists(_)))
    }

    /// A dictionary version that cannot name a folder (class: client).
    pub fn is_bad_version(&self) -> bool {
        matches!(
            self,
            Error::Dictionary(DictionaryError::Version(_)) | Error::Arena(ArenaError::Version(_))
        )
    }
}

impl Error {
    /// Whether the storage itself failed (see [`StoreError::is_storage_failure`], and an arena
    /// file that could not be grown or written) rather than the data read from it: the serving
    /// process then stops writing until its probe finds the storage taking writes again.
    pub fn is_storage_failure(&self) -> bool {
        match self {
            Error::Store(store) | Error::Arena(ArenaError::Store(store)) => {
                store.is_storage_failure()
            }
            Error::Arena(ArenaError::Io { .. }) => true,
            _ => false,
        }
    }
}
