//! `vectors.bin`: the dense table's on-disk format (grammar in `docs/format.md`).
//!
//! ```text
//! file      := header token_ids scales values
//! header    := magic:"PPTYDICT" format_version:u32 dims:u32 vocab_size:u32 rows:u32
//!              dtype:u32 reserved:[u8; 36]                                   (64 bytes)
//! token_ids := u32 × rows, strictly increasing, each < vocab_size
//! scales    := f32 × rows, finite and ≥ 0        (row vector = scale × values)
//! values    := i8 × rows × dims, row-major
//! ```
//! All integers little-endian. Nothing follows `values`.

use bytemuck::{Pod, Zeroable};

use super::DictionaryError;
use std::path::Path;

/// First bytes of every `vectors.bin`.
pub const MAGIC: [u8; 8] = *b"PPTYDICT";
/// The only table format this build reads.
pub const FORMAT_VERSION: u32 = 1;
/// `dtype` code: int8 values with one f32 scale per row.
pub const DTYPE_I8_ROW_SCALE: u32 = 1;

/// The fixed 64-byte header at the start of `vectors.bin`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Pod, Zeroable)]
pub struct TableHeader {
    pub magic: [u8; 8],
    pub format_version: u32,
    pub dims: u32,
    pub vocab_size: u32,
    pub rows: u32,
    pub dtype: u32,
    pub reserved: [u8; 36],
}

const HEADER_BYTES: usize = std::mem::size_of::<TableHeader>();
const _: () = assert!(HEADER_BYTES == 64);

/// The table, decoded and checked: owned columns ready for lookup.
#[derive(Debug, Clone)]
pub struct Table {
    pub header: TableHeader,
    pub token_ids: Vec<u32>,
    pub scales: Vec<f32>,
    pub values: Vec<i8>,
}

impl TableHeader {
    /// A header for a table of `rows` rows (used by writers and tests).
    pub fn new(dims: u32, vocab_size: u32, rows: u32) -> Self {
        Self {
            magic: MAGIC,
            format_version: FORMAT_VERSION,
            dims,
            vocab_size,
            rows,
            dtype: DTYPE_I8_ROW_SCALE,
            reserved: [0; 36],
        }
    }
}

impl Table {
    /// Serialise to the file format (the inverse of [`Table::parse`]).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(HEADER_BYTES + self.token_ids.len() * 8 + self.values.len());
        out.extend_from_slice(bytemuck::bytes_of(&self.header));
        for id in &self.token_ids {
            out.extend_from_slice(&id.to_le_bytes());
        }
        for scale in &self.scales {
            out.extend_from_slice(&scale.to_le_bytes());
        }
        out.extend_from_slice(bytemuck::cast_slice(&self.values));
        out
    }

    /// Decode and validate `bytes`, read from `path` (named in every error).
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Self, DictionaryError> {
        let corrupt = |reason: String| DictionaryError::Corrupt {
            path: path.to_path_buf(),
            reason,
        };
        if bytes.len() < HEADER_BYTES {
            return Err(DictionaryError::Truncated {
                path: path.to_path_buf(),
                expected_bytes: HEADER_BYTES as u64,
                found_bytes: bytes.len() as u64,
            });
        }
        let header: TableHeader = bytemuck::pod_read_unaligned(&bytes[..HEADER_BYTES]);
        if header.magic != MAGIC {
            return Err(corrupt(format!("bad magic {:?}", header.magic)));
        }
        if header.format_version != FORMAT_VERSION {
            return Err(DictionaryError::UnsupportedFormatVersion {
                path: path.to_path_buf(),
                found: header.format_version,
                supported: FORMAT_VERSION,
            });
        }
        if header.dtype != DTYPE_I8_ROW_SCALE {
            return Err(corrupt(format!("unknown dtype code {}", header.dtype)));
        }
        if header.dims == 0 || !header.dims.is_multiple_of(64) {
            return Err(corrupt(format!(
                "dims {} is not a positive multiple of 64",
                header.dims
            )));
        }
        if header.reserved != [0; 36] {
            return Err(corrupt("reserved header bytes are not zero".into()));
        }
        let rows = header.rows as usize;
        let dims = header.dims as usize;
        let expected = HEADER_BYTES as u64 + rows as u64 * (8 + dims as u64);
        if bytes.len() as u64 != expected {
            return Err(DictionaryError::Truncated {
                path: path.to_path_buf(),
                expected_bytes: expected,
                found_bytes: bytes.len() as u64,
            });
        }
        let ids_end = HEADER_BYTES + rows * 4;
        let scales_end = ids_end + rows * 4;
        let token_ids: Vec<u32> = bytes[HEADER_BYTES..ids_end]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let scales: Vec<f32> = bytes[ids_end..scales_end]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let values: Vec<i8> = bytemuck::cast_slice(&bytes[scales_end..]).to_vec();

        if let Some(pair) = token_ids.windows(2).position(|w| w[0] >= w[1]) {
            return Err(corrupt(format!(
                "token ids not strictly increasing at row {}",
                pair + 1
            )));
        }
        if let Some(&last) = token_ids.last()
            && last >= header.vocab_size
        {
            return Err(corrupt(format!(
                "token id {last} outside vocabulary of {}",
                header.vocab_size
            )));
        }
        if let Some(row) = scales.iter().position(|s| !s.is_finite() || *s < 0.0) {
            return Err(corrupt(format!(
                "row {row} has invalid scale {}",
                scales[row]
            )));
        }
        Ok(Self {
            header,
            token_ids,
            scales,
            values,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Table {
        Table {
            header: TableHeader::new(64, 100, 2),
            token_ids: vec![3, 70],
            scales: vec![0.5, 0.25],
            values: (0..128).map(|i| (i as i8).wrapping_mul(3)).collect(),
        }
    }

    #[test]
    fn round_trips() {
        let table = sample();
        let parsed = Table::parse(Path::new("t"), &table.to_bytes()).unwrap();
        assert_eq!(parsed.to_bytes(), table.to_bytes());
    }

    #[test]
    fn rejects_every_truncation() {
        let bytes = sample().to_bytes();
        for len in 0..bytes.len() {
            let err = Table::parse(Path::new("t"), &bytes[..len]).unwrap_err();
            assert!(
                matches!(err, DictionaryError::Truncated { .. }),
                "len {len}: {err}"
            );
        }
    }

    #[test]
    fn rejects_unsorted_ids_and_bad_scales() {
        let mut t = sample();
        t.token_ids = vec![70, 3];
        assert!(matches!(
            Table::parse(Path::new("t"), &t.to_bytes()),
            Err(DictionaryError::Corrupt { .. })
        ));
        let mut t = sample();
        t.scales[1] = f32::NAN;
        assert!(matches!(
            Table::parse(Path::new("t"), &t.to_bytes()),
            Err(DictionaryError::Corrupt { .. })
        ));
        let mut t = sample();
        t.token_ids[1] = 100;
        assert!(matches!(
            Table::parse(Path::new("t"), &t.to_bytes()),
            Err(DictionaryError::Corrupt { .. })
        ));
    }

    #[test]
    fn rejects_other_versions() {
        let mut t = sample();
        t.header.format_version = 2;
        assert!(matches!(
            Table::parse(Path::new("t"), &t.to_bytes()),
            Err(DictionaryError::UnsupportedFormatVersion { found: 2, .. })
        ));
    }
}
