//! The `perpetuity` binary: subcommands over the library ([`cli`]).

mod cli;

/// A turn allocates and frees many small buffers (decoded rows, embeddings, frame text) on
/// every thread at once; mimalloc's per-thread heaps serve that with less work than the system
/// allocator (`docs/journal/benchmarks.md`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    cli::run()
}
