//! The scan's pure kernels: slices in, scores out. Knows nothing of files, async or RocksDB.

pub mod kernels;
pub mod topk;
