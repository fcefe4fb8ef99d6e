//! The versioned dictionary: data in `dictionaries/<version>/`, never code.
//!
//! A dictionary is a header (`dictionary.json`: provenance, tokenizer and teacher hashes,
//! dimensions, dtype, the lexical analyzer and the weighting scheme) plus a dense table keyed by
//! token id (`vectors.bin`, int8 with one scale per row; absent ids are zero vectors). Loading
//! checks everything it can: format version, the tokenizer's fingerprint against the running
//! tokenizer, the table's size and SHA-256 against the header, and the table's own structure.
//! Any failure is a typed error naming the file.

pub mod derive;
pub mod format;
pub mod lexical;
pub mod stats;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::tokens::{self, Tokenizer};
use crate::types::TokenId;
use format::Table;
use lexical::LexicalSpec;

/// The header file in each version's folder.
pub const MANIFEST_FILE: &str = "dictionary.json";
/// The dense table in each version's folder.
pub const TABLE_FILE: &str = "vectors.bin";
/// The header format this build reads.
pub const MANIFEST_FORMAT_VERSION: u32 = 1;
/// The dictionary version served when none is configured.
pub const DEFAULT_VERSION: &str = "v4";
/// The only dtype this build reads: int8 values, one f32 scale per row.
const DTYPE_NAME: &str = "i8_row_scale";

/// The longest dictionary version name, in bytes.
pub const MAX_VERSION_BYTES: usize = 64;

/// A dictionary version refused because it cannot safely name a folder.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "dictionary version {0:?} cannot name a folder: it must be 1 to {MAX_VERSION_BYTES} of A-Z a-z 0-9 . _ - and not start with a dot"
)]
pub struct BadVersion(pub String);

/// `version` when it can name a folder of its own: 1 to [`MAX_VERSION_BYTES`] of `A-Z a-z 0-9
/// . _ -`, not starting with a dot. A version names folders (`<data>/arena/<version>/`,
/// `<data>/dictionaries/<version>/`, which a swap removes and replaces), so every path built
/// from one is built through here: `..`, `../x` or an absolute path would reach outside the
/// data directory, and a leading dot is kept for the upload's hidden temporary folder.
pub fn check_version(version: &str) -> Result<&str, BadVersion> {
    let named = (1..=MAX_VERSION_BYTES).contains(&version.len())
        && !version.starts_with('.')
        && version
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if named {
        Ok(version)
    } else {
        Err(BadVersion(version.to_owned()))
    }
}

/// Errors loading or using a dictionary. Every variant is class *corruption* (the shipped or
/// uploaded data is unusable) except [`DictionaryError::Io`] on a missing folder, which is a
/// configuration error the operator fixes, and those marked otherwise.
#[derive(Debug, thiserror::Error)]
pub enum DictionaryError {
    /// Class: client. A version (asked for, or in a header) that cannot name a folder.
    #[error(transparent)]
    Version(#[from] BadVersion),
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The header is not valid JSON or does not have the expected fields.
    #[error("{path}: malformed dictionary header: {source}")]
    Manifest {
        path: PathBuf,
        source: serde_json::Error,
    },
    /// The header or table declares a format version this build does not read.
    #[error("{path}: format version {found} is not supported (this build reads {supported})")]
    UnsupportedFormatVersion {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    /// A file is shorter or longer than its header says.
    #[error("{path}: truncated or padded: expected {expected_bytes} bytes, found {found_bytes}")]
    Truncated {
        path: PathBuf,
        expected_bytes: u64,
        found_bytes: u64,
    },
    /// A file's SHA-256 differs from the one recorded in the header.
    #[error("{path}: sha256 {found} does not match the header's {expected}")]
    HashMismatch {
        path: PathBuf,
        expected: String,
        found: String,
    },
    /// The dictionary was built for another tokenizer than the one this binary runs.
    #[error("{path}: built for tokenizer {name} ({sha256}); this binary runs {TOKENIZER} ({running})", TOKENIZER = tokens::TOKENIZER_NAME)]
    TokenizerMismatch {
        path: PathBuf,
        name: String,
        sha256: String,
        running: String,
    },
    /// The header and the table disagree, or a field has a value this build does not know.
    #[error("{path}: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    /// Class: internal. Copying a dictionary into the data directory (`dict install`) failed.
    #[error("cannot upload the dictionary to {path}: {source}")]
    Upload {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// `dictionary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format_version: u32,
    pub version: String,
    pub tokenizer: TokenizerInfo,
    pub teacher: TeacherInfo,
    pub dims: u32,
    pub dtype: String,
    pub vocab_size: u32,
    pub rows: u32,
    pub pooling: String,
    pub reduction: Reduction,
    pub weighting: Weighting,
    pub lexical: LexicalSpec,
    /// How the hybrid score weighs this table's dense part (absent: [`DEFAULT_DENSE_WEIGHT`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hybrid: Option<Hybrid>,
    pub files: BTreeMap<String, FileInfo>,
    pub build: BuildInfo,
    pub licence: String,
    pub provenance: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizerInfo {
    pub name: String,
    pub source: String,
    pub sha256: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TeacherInfo {
    pub name: String,
    pub package: String,
    pub wheel_sha256: String,
    pub safetensors_sha256: String,
    pub licence: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reduction {
    pub method: String,
    pub from_dims: u32,
    pub to_dims: u32,
    pub explained_variance: f64,
}

/// How token vectors are weighted into a text's vector (see [`derive::token_weight`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Weighting {
    pub scheme: WeightingScheme,
    /// SIF smoothing constant `a`.
    pub a: f64,
    pub prior: Prior,
    /// Pseudo-tokens of prior mass mixed into the corpus counts.
    pub prior_mass_tokens: f64,
    pub note: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WeightingScheme {
    /// Smooth inverse frequency: `a / (a + p(t))`.
    Sif,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Prior {
    /// `p(t) ∝ 1 / (t + 2)`: token ids of BPE vocabularies are roughly frequency ranks.
    Zipf,
}

/// The dense weight a table without a `hybrid` block is scored with: chosen with `v3`'s
/// distilled table on LoCoMo and RealMem (`docs/journal/benchmarks.md`).
pub const DEFAULT_DENSE_WEIGHT: f32 = 0.4;

/// How the hybrid score weighs a table's dense part: a better table earns a different share
/// (`relevance::HybridScorer`), so the weight travels with the table through a hot swap.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, try_from = "HybridFields")]
pub struct Hybrid {
    /// The dense part's share of the score, in 0..=1; the lexical part has the rest.
    pub dense_weight: f32,
}

/// [`Hybrid`] as written, before its range is checked.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HybridFields {
    dense_weight: f32,
}

impl TryFrom<HybridFields> for Hybrid {
    type Error = String;

    fn try_from(HybridFields { dense_weight }: HybridFields) -> Result<Self, String> {
        if (0.0..=1.0).contains(&dense_weight) {
            Ok(Self { dense_weight })
        } else {
            Err(format!(
                "hybrid.dense_weight must lie in 0..=1, not {dense_weight}"
            ))
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileInfo {
    pub bytes: u64,
    pub sha256: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildInfo {
    pub tool: String,
    pub tool_version: String,
    pub python: String,
    pub numpy: String,
    pub tokenizers: String,
    pub seconds: u64,
}

/// A loaded, validated dictionary.
#[derive(Debug)]
pub struct Dictionary {
    dir: PathBuf,
    manifest: Manifest,
    table: Table,
    /// Token id → table row, `u32::MAX` where the table has no row.
    row_of: Vec<u32>,
    /// `Σ_{r < vocab} 1/(r+2)`: normaliser of the Zipf prior.
    zipf_norm: f64,
}

impl Dictionary {
    /// Load `root/<version>/`.
    pub fn load_version(root: &Path, version: &str) -> Result<Self, DictionaryError> {
        Self::load(&root.join(check_version(version)?))
    }

    /// Load and validate the dictionary in `dir`.
    pub fn load(dir: &Path) -> Result<Self, DictionaryError> {
        let manifest_path = dir.join(MANIFEST_FILE);
        let manifest = read_manifest(&manifest_path)?;
        check_version(&manifest.version)?;
        let corrupt = |path: &Path, reason: String| DictionaryError::Corrupt {
            path: path.to_path_buf(),
            reason,
        };

        let running = Tokenizer::new().fingerprint();
        if manifest.tokenizer.name != tokens::TOKENIZER_NAME || manifest.tokenizer.sha256 != running
        {
            return Err(DictionaryError::TokenizerMismatch {
                path: manifest_path,
                name: manifest.tokenizer.name,
                sha256: manifest.tokenizer.sha256,
                running: running.to_owned(),
            });
        }
        if manifest.dtype != DTYPE_NAME {
            return Err(corrupt(
                &manifest_path,
                format!("unknown dtype {:?}", manifest.dtype),
            ));
        }
        if manifest.vocab_size != tokens::VOCAB_SIZE {
            return Err(corrupt(
                &manifest_path,
                format!(
                    "vocab_size {} differs from the tokenizer's {}",
                    manifest.vocab_size,
                    tokens::VOCAB_SIZE
                ),
            ));
        }
        let table_path = dir.join(TABLE_FILE);
        let recorded = manifest.files.get(TABLE_FILE).ok_or_else(|| {
            corrupt(
                &manifest_path,
                format!("files has no entry for {TABLE_FILE}"),
            )
        })?;
        let bytes = std::fs::read(&table_path).map_err(|source| DictionaryError::Io {
            path: table_path.clone(),
            source,
        })?;
        if bytes.len() as u64 != recorded.bytes {
            return Err(DictionaryError::Truncated {
                path: table_path,
                expected_bytes: recorded.bytes,
                found_bytes: bytes.len() as u64,
            });
        }
        let found = tokens::hex(&Sha256::digest(&bytes));
        if found != recorded.sha256 {
            return Err(DictionaryError::HashMismatch {
                path: table_path,
                expected: recorded.sha256.clone(),
                found,
            });
        }
        let table = Table::parse(&table_path, &bytes)?;
        let h = &table.header;
        if (h.dims, h.vocab_size, h.rows) != (manifest.dims, manifest.vocab_size, manifest.rows) {
            return Err(corrupt(
                &table_path,
                format!(
                    "table says dims {} vocab {} rows {}, header says dims {} vocab {} rows {}",
                    h.dims, h.vocab_size, h.rows, manifest.dims, manifest.vocab_size, manifest.rows
                ),
            ));
        }

        let mut row_of = vec![u32::MAX; manifest.vocab_size as usize];
        for (row, &id) in table.token_ids.iter().enumerate() {
            row_of[id as usize] = row as u32;
        }
        let zipf_norm = (0..manifest.vocab_size)
            .map(|r| 1.0 / (f64::from(r) + 2.0))
            .sum();
        Ok(Self {
            dir: dir.to_path_buf(),
            manifest,
            table,
            row_of,
            zipf_norm,
        })
    }

    /// The folder this dictionary was loaded from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The version name (retrieval rows are tagged with it).
    pub fn version(&self) -> &str {
        &self.manifest.version
    }

    /// The validated header.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Dense dimensions.
    pub fn dims(&self) -> usize {
        self.manifest.dims as usize
    }

    /// Rows in the dense table (tokens with a vector).
    pub fn rows(&self) -> usize {
        self.table.token_ids.len()
    }

    /// The lexical analyzer.
    pub fn lexical(&self) -> &LexicalSpec {
        &self.manifest.lexical
    }

    /// The weighting scheme.
    pub fn weighting(&self) -> &Weighting {
        &self.manifest.weighting
    }

    /// The dense part's share of the hybrid score for this table.
    pub fn dense_weight(&self) -> f32 {
        self.manifest
            .hybrid
            .map_or(DEFAULT_DENSE_WEIGHT, |hybrid| hybrid.dense_weight)
    }

    /// The table row of `token`, `None` for a zero row.
    fn row(&self, token: TokenId) -> Option<usize> {
        let row = *self.row_of.get(token.0 as usize)?;
        (row != u32::MAX).then_some(row as usize)
    }

    /// The int8 values of table row `row`.
    fn values(&self, row: usize) -> &[i8] {
        let dims = self.dims();
        &self.table.values[row * dims..(row + 1) * dims]
    }

    /// The table vector of `token` as `(scale, int8 values)`, or `None` for a zero row.
    pub fn vector(&self, token: TokenId) -> Option<(f32, &[i8])> {
        let row = self.row(token)?;
        Some((self.table.scales[row], self.values(row)))
    }

    /// Start loading the vector of `token` and its scale (a cache hint; nothing if it has
    /// none). The table is tens of megabytes and a row's tokens lie anywhere in it, so an
    /// embedding that loads the vectors of the tokens a few places ahead overlaps those misses
    /// with its sums.
    pub fn prefetch_vector(&self, token: TokenId) {
        let Some(row) = self.row(token) else {
            return;
        };
        for line in self.values(row).chunks(64) {
            crate::scan::kernels::prefetch(line.as_ptr());
        }
        crate::scan::kernels::prefetch(&self.table.scales[row]);
    }

    /// Start loading where the table row of `token` is recorded (what
    /// [`Dictionary::prefetch_vector`] reads first): a cache hint, so that the vector's own
    /// load, a few tokens later, does not wait on it.
    pub fn prefetch_row_index(&self, token: TokenId) {
        if let Some(row) = self.row_of.get(token.0 as usize) {
            crate::scan::kernels::prefetch(row);
        }
    }

    /// The prior probability of `token` (Zipf over token ids).
    pub fn prior(&self, token: TokenId) -> f64 {
        match self.manifest.weighting.prior {
            Prior::Zipf => 1.0 / ((f64::from(token.0) + 2.0) * self.zipf_norm),
        }
    }
}

/// Read `dictionary.json`.
fn read_manifest(path: &Path) -> Result<Manifest, DictionaryError> {
    let text = std::fs::read(path).map_err(|source| DictionaryError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Manifest::parse(path, &text)
}

impl Manifest {
    /// Decode `dictionary.json`'s bytes, read from `path` (named in every error), checking the
    /// format version before the fields so that a newer header is reported as such rather than
    /// as a missing field.
    pub fn parse(path: &Path, text: &[u8]) -> Result<Self, DictionaryError> {
        let malformed = |source| DictionaryError::Manifest {
            path: path.to_path_buf(),
            source,
        };
        let value: serde_json::Value = serde_json::from_slice(text).map_err(malformed)?;
        let found = value
            .get("format_version")
            .and_then(serde_json::Value::as_u64);
        if found != Some(u64::from(MANIFEST_FORMAT_VERSION)) {
            return Err(DictionaryError::UnsupportedFormatVersion {
                path: path.to_path_buf(),
                found: found.map_or(0, |v| u32::try_from(v).unwrap_or(u32::MAX)),
                supported: MANIFEST_FORMAT_VERSION,
            });
        }
        serde_json::from_value(value).map_err(malformed)
    }
}
