#!/usr/bin/env bash
# Runs every fuzz target (fuzz/, cargo-fuzz and libFuzzer) for FUZZ_SECONDS seconds each (30 by
# default) and fails on the first crash; the crashing input is left in fuzz/artifacts/TARGET/.
# Installs what it lacks: the nightly toolchain (minimal profile) and cargo-fuzz at the pinned
# version. `FUZZ_SECONDS=600 tools/fuzz-smoke.sh` is the long run; `FUZZ_TARGETS="sse arena"`
# runs some targets only; `tools/fuzz-smoke.sh --rocksdb-lib-dir` only prints the folder of the
# RocksDB library it would link (below). docs/reliability.md lists the targets and what each
# asserts.
#
# The fuzz build has its own target directory (its compiler flags differ). It links the RocksDB
# library the main release build already compiled in $CARGO_TARGET_DIR (or target/), when there
# is one, rather than compiling it again (about 20 minutes on 2 cores): the fuzz targets never
# reach RocksDB's code with fuzzed bytes, so it needs no coverage instrumentation.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${FUZZ_SECONDS:-30}"
toolchain="${FUZZ_TOOLCHAIN:-nightly}"
cargo_fuzz="0.13.1"
fuzz_target="${FUZZ_TARGET_DIR:-/var/tmp/perpetuity-fuzz-target}"
corpus="${FUZZ_CORPUS:-/var/tmp/perpetuity-fuzz-corpus}"
shared="${PERPETUITY_SHARED:-../shared}"
export CARGO_TERM_COLOR=never

# The fuzz workspace builds in fuzz/, so the folder it is handed must not be relative to here.
main_target="${CARGO_TARGET_DIR:-target}"
case "$main_target" in /*) ;; *) main_target="$PWD/$main_target" ;; esac
built=$(ls -t "$main_target"/release/build/librocksdb-sys-*/out/librocksdb.a 2>/dev/null | head -n 1 || true)
if [ "${1:-}" = "--rocksdb-lib-dir" ]; then
  # Only say which RocksDB the fuzz build would link (.ci/run checks it), and fail if none.
  [ -n "$built" ] && echo "${built%/librocksdb.a}"
  exit $(( ${#built} == 0 ))
fi
rustup toolchain list | grep -q "^${toolchain}" ||
  rustup toolchain install "$toolchain" --profile minimal
[ "$(cargo fuzz --version 2>/dev/null)" = "cargo-fuzz ${cargo_fuzz}" ] ||
  cargo install --locked cargo-fuzz --version "$cargo_fuzz"

rocksdb_version() { awk '$0 == "name = \"librocksdb-sys\"" { getline; print $3 }' "$1"; }
if [ "$(rocksdb_version Cargo.lock)" != "$(rocksdb_version fuzz/Cargo.lock)" ]; then
  echo "fuzz/Cargo.lock names another librocksdb-sys than Cargo.lock: update it" >&2
  exit 1
fi
if [ -n "$built" ]; then
  export ROCKSDB_LIB_DIR="${built%/librocksdb.a}" ROCKSDB_STATIC=1
  echo "fuzz: linking the RocksDB of the main build ($ROCKSDB_LIB_DIR)"
fi
# cargo-fuzz's RUSTFLAGS replace the ones of .cargo/config.toml: hand them over, so the targets
# run the instruction set the shipped binary is built for.
rustflags=$(sed -n 's/^rustflags = \[\(.*\)\]$/\1/p' .cargo/config.toml | tr -d '",')
export RUSTFLAGS="${RUSTFLAGS:-} ${rustflags}"

fuzz() { cargo "+${toolchain}" fuzz "$1" --target-dir "$fuzz_target" "${@:2}"; }
started=$(date +%s)
fuzz build
echo "fuzz: built in $(( $(date +%s) - started ))s"

# Seeds beyond the committed ones (fuzz/seeds/): the shipped dictionary's manifest, and the
# recorded provider streams of the shared data folder when it is there (byte 0 picks the
# format, byte 1 where the stream is cut; see fuzz/src/lib.rs).
mkdir -p "$corpus"/{dictionary_manifest,sse}
cp dictionaries/v1/dictionary.json "$corpus/dictionary_manifest/shipped"
if [ -d "$shared/fixtures/providers" ]; then
  python3 - "$shared/fixtures/providers" "$corpus/sse" <<'EOF'
import json, pathlib, sys
fixtures, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
formats = {"openai-chat": 0, "openai-responses": 1, "anthropic-messages": 2, "gemini": 3}
for folder, index in formats.items():
    for path in sorted((fixtures / folder).glob("*")):
        if path.suffix == ".sse":
            stream = path.read_bytes()
        elif path.suffix == ".jsonl":
            lines = [l for l in path.read_text().splitlines() if l.strip()]
            stream = b"".join(
                (f"data: {l}\r\n\r\n" if index == 3 else
                 f"event: {json.loads(l).get('type', '')}\ndata: {l}\n\n").encode()
                for l in lines)
        else:
            continue
        (out / f"{folder}-{path.name}").write_bytes(bytes([index, 0x80]) + stream)
EOF
fi

targets="${FUZZ_TARGETS:-$(cargo "+${toolchain}" fuzz list | tr '\n' ' ')}"
for target in $targets; do
  mkdir -p "$corpus/$target"
  seeds=()
  [ -d "fuzz/seeds/$target" ] && seeds=("fuzz/seeds/$target")
  log="$corpus/$target.log"
  if ! fuzz run "$target" "$corpus/$target" "${seeds[@]}" -- \
    -max_total_time="$seconds" -max_len=8192 -timeout=10 -print_final_stats=1 >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "fuzz: $target failed; the input is in fuzz/artifacts/$target/" >&2
    exit 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  corpus_size=$(ls "$corpus/$target" | wc -l)
  echo "fuzz: $target: ${runs} runs in ${seconds}s, no crash; corpus ${corpus_size} inputs"
done
echo "fuzz: done in $(( $(date +%s) - started ))s"
