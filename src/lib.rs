//! Perpetuity: a memory proxy for LLM agents.
//!
//! Layers, bottom to top (lower layers never import higher ones; `docs/architecture.md`):
//! `types`, `codec`, `config`, `failpoint`, `latency`, `tokens` → `scan` → `dictionary` →
//! `store`, `memory` → `relevance` → `arena` → `retrieve` → `heat`, `budget`, `frame` →
//! `recall` → `capture`, `datasets`, `ingest`, `memory_tools`, `integrity`, `backup` →
//! `error` → `swap`, `measure`, `eval` → `engine` → `proxy`.

#![deny(unsafe_code)]

pub mod arena;
pub mod backup;
pub mod budget;
pub mod capture;
pub mod codec;
pub mod config;
pub mod datasets;
pub mod dictionary;
pub mod engine;
pub mod error;
pub mod eval;
pub mod failpoint;
pub mod frame;
pub mod heat;
pub mod ingest;
pub mod integrity;
pub mod latency;
pub mod measure;
pub mod memory;
pub mod memory_tools;
pub mod proxy;
pub mod recall;
pub mod relevance;
pub mod retrieve;
pub mod scan;
pub mod store;
pub mod swap;
pub mod tokens;
pub mod types;
