#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build and test Perpetuity: clang and libclang
# (bindgen for the bundled RocksDB), Python's venv, and a virtual environment holding the
# official openai, anthropic and google-genai SDKs at pinned versions for the
# wire-compatibility tests (`$PERPETUITY_SDK_VENV`, default /var/tmp/perpetuity-sdk-venv),
# with the older anthropic 1.17.0 (which sends `x-api-key` where 2.x sends a Bearer token) as
# a package folder beside it, `anthropic-1.17.0`, put first on PYTHONPATH by its test. Does
# nothing when they are already there.
set -euo pipefail
need=()
command -v clang >/dev/null 2>&1 || need+=(clang)
dpkg -s libclang-dev >/dev/null 2>&1 || need+=(libclang-dev)
command -v python3 >/dev/null 2>&1 || need+=(python3)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
if [ "${#need[@]}" -gt 0 ]; then
  echo "installing: ${need[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq "${need[@]}"
fi

venv="${PERPETUITY_SDK_VENV:-/var/tmp/perpetuity-sdk-venv}"
sdks=(openai==3.57.0 anthropic==2.14.0 google-genai==3.6.1)
pip=("$venv/bin/pip" install -q --disable-pip-version-check)
if ! "$venv/bin/python" -c 'import openai, anthropic, sys; from google import genai; sys.exit(not (openai.__version__ == "3.57.0" and anthropic.__version__ == "2.14.0" and genai.__version__ == "3.6.1"))' >/dev/null 2>&1; then
  echo "making the SDK environment in $venv: ${sdks[*]}"
  if ! { python3 -m venv "$venv" && "${pip[@]}" "${sdks[@]}"; }; then
    echo "WARNING: could not make the SDK environment (is PyPI reachable?); the official-SDK tests will SKIP" >&2
  fi
fi
legacy="$venv/anthropic-1.17.0"
if [ -x "$venv/bin/python" ] && ! PYTHONPATH="$legacy" "$venv/bin/python" -c 'import anthropic, sys; sys.exit(anthropic.__version__ != "1.17.0")' >/dev/null 2>&1; then
  echo "installing anthropic==1.17.0 into $legacy"
  rm -rf "$legacy"
  if ! "${pip[@]}" --no-deps --target "$legacy" anthropic==1.17.0; then
    rm -rf "$legacy"
    echo "WARNING: could not install anthropic 1.17.0 (is PyPI reachable?); its test will SKIP" >&2
  fi
fi

# The real agent harnesses for tests/harness.rs, at pinned versions: Claude Code, Codex, Gemini CLI,
# OpenCode, pi, openai-node and the AI SDK from npm into a prefix (`$PERPETUITY_HARNESS_NPM`,
# default /var/tmp/perpetuity-harness-npm; Debian's nodejs and npm are installed when node or npm
# is missing); openai-agents, langchain, litellm, mini-swe-agent and pydantic-ai from PyPI into a
# second virtual environment (`$PERPETUITY_HARNESS_VENV`, default
# /var/tmp/perpetuity-harness-venv; its openai pin differs from the SDK environment's); and Aider,
# whose litellm and openai pins differ from that environment's, into a third
# (`$PERPETUITY_AIDER_VENV`, default /var/tmp/perpetuity-aider-venv). Each part that cannot be
# installed (a registry unreachable) says WARNING and its tests SKIP.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "installing: nodejs npm"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  if ! { DEBIAN_FRONTEND=noninteractive $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nodejs npm; }; then
    echo "WARNING: could not install nodejs and npm; the npm harness tests will SKIP" >&2
  fi
fi
npm_prefix="${PERPETUITY_HARNESS_NPM:-/var/tmp/perpetuity-harness-npm}"
npm_pins=(@anthropic-ai/claude-code@2.1.332 @openai/codex@0.171.0 @google/gemini-cli@0.61.0
  opencode-ai@1.18.33 @mariozechner/pi-coding-agent@0.73.1 ai@7.0.173 @ai-sdk/openai@4.0.118
  @ai-sdk/anthropic@4.0.105 openai@7.59.0 zod@4.6.7)
npm_pinned() {
  local pin name
  for pin in "${npm_pins[@]}"; do
    name="${pin%@*}"
    [ "$(node -p "require('$npm_prefix/node_modules/$name/package.json').version" 2>/dev/null)" = "${pin##*@}" ] || return 1
  done
  local bin
  for bin in claude codex gemini opencode pi; do
    "$npm_prefix/node_modules/.bin/$bin" --version >/dev/null 2>&1 </dev/null || return 1
  done
}
if command -v npm >/dev/null 2>&1 && ! npm_pinned; then
  echo "installing the npm harnesses into $npm_prefix: ${npm_pins[*]}"
  mkdir -p "$npm_prefix"
  if ! npm install --prefix "$npm_prefix" --no-audit --no-fund --loglevel=error "${npm_pins[@]}" || ! npm_pinned; then
    echo "WARNING: could not install the npm harnesses (is the npm registry reachable?); their tests will SKIP" >&2
  fi
fi
harness_venv="${PERPETUITY_HARNESS_VENV:-/var/tmp/perpetuity-harness-venv}"
py_pins=(openai-agents==0.24.0 langchain-openai==1.8.1 langchain-anthropic==1.7.10 litellm==1.110.2
  mini-swe-agent==2.4.6 'pydantic-ai-slim[openai,anthropic]==2.66.0')
# Whether the environment `$1` holds the pins after it, each at its version (extras ignored).
venv_pinned() {
  "$1/bin/python" - "${@:2}" >/dev/null 2>&1 <<'PY'
import re, sys
from importlib.metadata import version
pins = (re.sub(r"\[.*\]", "", pin).split("==") for pin in sys.argv[1:])
sys.exit(any(version(name) != pinned for name, pinned in pins))
PY
}
if ! venv_pinned "$harness_venv" "${py_pins[@]}"; then
  echo "making the harness environment in $harness_venv: ${py_pins[*]}"
  if ! { python3 -m venv "$harness_venv" && "$harness_venv/bin/pip" install -q --disable-pip-version-check "${py_pins[@]}"; }; then
    echo "WARNING: could not make the harness environment (is PyPI reachable?); the Python harness tests will SKIP" >&2
  fi
fi
aider_venv="${PERPETUITY_AIDER_VENV:-/var/tmp/perpetuity-aider-venv}"
aider_pin=aider-chat==0.86.2
if ! venv_pinned "$aider_venv" "$aider_pin"; then
  echo "making the Aider environment in $aider_venv: $aider_pin"
  if ! { python3 -m venv "$aider_venv" && "$aider_venv/bin/pip" install -q --disable-pip-version-check "$aider_pin"; }; then
    echo "WARNING: could not make the Aider environment (is PyPI reachable?); the Aider tests will SKIP" >&2
  fi
fi

# HAProxy for the sharded deployment (deploy/haproxy) and its test (tests/haproxy.rs): Debian's
# package (2.6 on Debian 12), installed when haproxy is neither on PATH nor in /usr/sbin. Where it
# cannot be installed the script says WARNING and the test SKIPs.
if ! command -v haproxy >/dev/null 2>&1 && [ ! -x /usr/sbin/haproxy ]; then
  echo "installing: haproxy"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  if ! { DEBIAN_FRONTEND=noninteractive $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq haproxy; }; then
    echo "WARNING: could not install haproxy; the HAProxy deployment test will SKIP" >&2
  fi
fi

# Headless Chromium (Debian's) and playwright-core, pinned, for the inspector's browser test
# (tests/inspector.rs): playwright-core into its own npm prefix (`$PERPETUITY_BROWSER_NPM`,
# default /var/tmp/perpetuity-browser-npm); it downloads no browser and drives Debian's. 1.61.1
# runs on Debian's Node 18 as on Node 20. Where either cannot be installed the script says
# WARNING and the test SKIPs.
if [ ! -x /usr/lib/chromium/chromium ]; then
  echo "installing: chromium"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  if ! { DEBIAN_FRONTEND=noninteractive $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium; }; then
    echo "WARNING: could not install chromium; the inspector's browser test will SKIP" >&2
  fi
fi
browser_npm="${PERPETUITY_BROWSER_NPM:-/var/tmp/perpetuity-browser-npm}"
playwright_pin=1.61.1
if command -v npm >/dev/null 2>&1 && [ "$(node -p "require('$browser_npm/node_modules/playwright-core/package.json').version" 2>/dev/null)" != "$playwright_pin" ]; then
  echo "installing playwright-core@$playwright_pin into $browser_npm"
  mkdir -p "$browser_npm"
  if ! npm install --prefix "$browser_npm" --no-audit --no-fund --loglevel=error "playwright-core@$playwright_pin"; then
    echo "WARNING: could not install playwright-core (is npm's registry reachable?); the inspector's browser test will SKIP" >&2
  fi
fi
