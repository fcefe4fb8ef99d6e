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
