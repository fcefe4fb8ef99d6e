//! Configuration defaults: one place for every path and limit the binary starts with.

use std::net::SocketAddr;
use std::path::PathBuf;

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

/// What `serve` needs to start.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub dictionaries_root: PathBuf,
    pub dictionary_version: String,
}
