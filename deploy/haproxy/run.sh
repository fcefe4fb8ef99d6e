#!/usr/bin/env bash
# Three `perpetuity serve` nodes on loopback and HAProxy in front of them, sharding users by a
# consistent hash of their key (deploy/README.md). Runs in the foreground; Ctrl-C stops all.
#
#   deploy/haproxy/run.sh [options] DIR [-- SERVE-ARGS...]
#
# DIR holds the nodes' data directories (DIR/node0, DIR/node1, DIR/node2, created if missing)
# and their logs (DIR/node0.log, ...). SERVE-ARGS are passed to every node, e.g.
# `--upstream openai=https://api.openai.com` or `--config FILE` (each node also reads the
# PERPETUITY_* environment, as `perpetuity serve` always does; --listen and --data are set here).
#
# Options:
#   --port PORT            the balancer's port                     8787
#   --node-ports A,B,C     the three nodes' ports                  PORT+1, PORT+2, PORT+3
#   --stats-port PORT      HAProxy's statistics page (/stats)      PORT+4
#   --check-inter TIME     time between health checks of a node    2s
#   --fall N               failed checks that mark a node down     2
#   --rise N               passed checks that mark it up again     2
#   --key user|credential  what the ring hashes (README)           user
#
# The binary is $PERPETUITY_BIN, else `perpetuity` on PATH, else the release build
# ($CARGO_TARGET_DIR, else target/, under the repository). HAProxy (2.6 or later) is `haproxy`
# on PATH, else /usr/sbin/haproxy (Debian: `apt-get install haproxy`).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

port=8787 node_ports="" stats_port="" inter=2s fall=2 rise=2 key=user dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --port) port="$2"; shift 2 ;;
    --node-ports) node_ports="$2"; shift 2 ;;
    --stats-port) stats_port="$2"; shift 2 ;;
    --check-inter) inter="$2"; shift 2 ;;
    --fall) fall="$2"; shift 2 ;;
    --rise) rise="$2"; shift 2 ;;
    --key) key="$2"; shift 2 ;;
    -h|--help) usage ;;
    --) shift; break ;;
    -*) echo "unknown option: $1" >&2; usage ;;
    *) [ -z "$dir" ] || usage; dir="$1"; shift ;;
  esac
done
[ -n "$dir" ] || usage
case "$key" in user|credential) ;; *) echo "--key is user or credential" >&2; exit 2 ;; esac
if [ -n "$node_ports" ]; then
  IFS=, read -r -a nodes <<<"$node_ports"
  [ "${#nodes[@]}" -eq 3 ] || { echo "--node-ports takes three ports, A,B,C" >&2; exit 2; }
else
  nodes=("$((port + 1))" "$((port + 2))" "$((port + 3))")
fi
stats_port="${stats_port:-$((port + 4))}"

binary="${PERPETUITY_BIN:-}"
if [ -z "$binary" ]; then
  if command -v perpetuity >/dev/null 2>&1; then
    binary="$(command -v perpetuity)"
  else
    binary="${CARGO_TARGET_DIR:-$repo/target}/release/perpetuity"
  fi
fi
[ -x "$binary" ] || { echo "no perpetuity binary at $binary: build it (cargo build --release) or set PERPETUITY_BIN" >&2; exit 1; }
haproxy="$(command -v haproxy || true)"
[ -n "$haproxy" ] || [ ! -x /usr/sbin/haproxy ] || haproxy=/usr/sbin/haproxy
[ -n "$haproxy" ] || { echo "haproxy is neither on PATH nor in /usr/sbin (Debian: apt-get install haproxy)" >&2; exit 1; }

mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
pids=()
stop() {
  trap - INT TERM EXIT
  local pid
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap 'stop; exit 130' INT
trap 'stop; exit 143' TERM
trap stop EXIT

node_command() {
  printf '%q ' "$binary" serve --listen "127.0.0.1:${nodes[$1]}" --data "$dir/node$1" "${serve_args[@]}"
}
serve_args=("$@")
# One server secret for every node (docs/scale-out.md): a credential is keyed to the same user
# on each, so a user exported from one node and imported on another is reached there.
secret="$dir/node0/secret"
mkdir -p -m 700 "$dir/node0" "$dir/node1" "$dir/node2"
[ -f "$secret" ] || (umask 077 && head -c 32 /dev/urandom >"$secret")
for i in 1 2; do
  if [ ! -f "$dir/node$i/secret" ]; then
    install -m 600 "$secret" "$dir/node$i/secret"
  elif ! cmp -s "$secret" "$dir/node$i/secret"; then
    echo "node$i has a secret of its own: users could not move between the nodes (copy $secret to it before its first start)" >&2
    exit 1
  fi
done
declare -A names
for i in 0 1 2; do
  "$binary" serve --listen "127.0.0.1:${nodes[$i]}" --data "$dir/node$i" "${serve_args[@]}" \
    >>"$dir/node$i.log" 2>&1 &
  pids+=("$!")
  names[$!]="node$i"
done

# HAProxy starts once every node answers /healthz, so it sees none of them down at first; the
# addresses are printed once it answers too.
healthy() {
  timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" &&
    printf "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" >&3 &&
    head -c 12 <&3' _ "$1" 2>/dev/null | grep -q ' 200'
}
for i in 0 1 2; do
  waited=0
  until healthy "${nodes[$i]}"; do
    if ! kill -0 "${pids[$i]}" 2>/dev/null; then
      echo "node$i exited while starting; the end of $dir/node$i.log:" >&2
      tail -n 5 "$dir/node$i.log" >&2
      exit 1
    fi
    [ "$waited" -lt 600 ] || { echo "node$i did not answer /healthz within 60 s" >&2; exit 1; }
    sleep 0.1
    waited=$((waited + 1))
  done
done

export PERPETUITY_LB_LISTEN="127.0.0.1:$port"
export PERPETUITY_LB_STATS="127.0.0.1:$stats_port"
export PERPETUITY_NODE0="127.0.0.1:${nodes[0]}"
export PERPETUITY_NODE1="127.0.0.1:${nodes[1]}"
export PERPETUITY_NODE2="127.0.0.1:${nodes[2]}"
export PERPETUITY_LB_NAME="perpetuity-$port"
export PERPETUITY_LB_KEY="$key"
export PERPETUITY_LB_CHECK_INTER="$inter"
export PERPETUITY_LB_CHECK_FALL="$fall"
export PERPETUITY_LB_CHECK_RISE="$rise"
"$haproxy" -db -f "$here/haproxy.cfg" &
pids+=("$!")
names[$!]=haproxy
until healthy "$port"; do
  kill -0 "${pids[3]}" 2>/dev/null || { echo "haproxy exited while starting" >&2; exit 1; }
  sleep 0.1
done

echo "balancer:  http://127.0.0.1:$port (HAProxy; statistics at http://127.0.0.1:$stats_port/stats)"
for i in 0 1 2; do
  echo "node$i:     http://127.0.0.1:${nodes[$i]} (data $dir/node$i, log $dir/node$i.log)"
done
echo "Ctrl-C stops all four."

# A node that exits leaves its users passing through without memory until it is started again
# (by hand, with the command printed); HAProxy exiting stops everything.
running=("${pids[@]}")
while [ "${#running[@]}" -gt 0 ]; do
  status=0
  wait -n -p exited "${running[@]}" || status=$?
  name="${names[$exited]}"
  left=()
  for pid in "${running[@]}"; do [ "$pid" = "$exited" ] || left+=("$pid"); done
  running=("${left[@]}")
  if [ "$name" = haproxy ]; then
    echo "haproxy exited (status $status); stopping the nodes" >&2
    exit 1
  fi
  echo "$name exited (status $status; its log: $dir/$name.log). Its users pass through without memory until it runs again:" >&2
  echo "  $(node_command "${name#node}")>>$dir/$name.log 2>&1" >&2
done
