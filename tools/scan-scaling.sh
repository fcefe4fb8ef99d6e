#!/usr/bin/env bash
# Scan scaling on a many-core machine: one store of $ROWS rows in one scope (the worst case),
# then one of $ROWS rows pooled over 1,000 users, each queried with 1, 2, 4, ... threads.
# Usage: tools/scan-scaling.sh BIN WORK_DIR OUT_DIR   (BIN: a release `perpetuity` binary)
# Settings: ROWS (1000000), THREADS ("1 2 4 8 16"), SCOPES ("one pooled").
# Prints the machine, then one `bench scan --json` object a line into OUT_DIR/scan.jsonl.
set -euo pipefail
bin=$1 work=$2 out=$3
rows=${ROWS:-1000000}
threads=${THREADS:-"1 2 4 8 16"}
dicts=$(cd "$(dirname "$0")/.." && pwd)/dictionaries
mkdir -p "$work" "$out"
{ date -u; nproc; lscpu | grep -E 'Model name|^L3|NUMA node\(s\)'; free -g | head -2; uname -r; } \
    > "$out/machine.txt"
scan() {
    "$bin" bench scan --dictionaries "$dicts" --rows "$rows" --data "$work/$1" --users "$2" \
        --threads "$3" --queries "$4" --fidelity-queries "$5" --json 2>>"$out/stderr.txt" \
        | tee -a "$out/scan.jsonl"
}
case " ${SCOPES:-one pooled} " in *" one "*) for t in $threads; do scan one 1 "$t" 200 10; done ;; esac
case " ${SCOPES:-one pooled} " in *" pooled "*) for t in $threads; do scan pooled 1000 "$t" 2000 0; done ;; esac
