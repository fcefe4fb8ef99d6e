#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build and test Perpetuity: clang and libclang
# (bindgen for the bundled RocksDB). Does nothing when they are already there.
set -euo pipefail
need=()
command -v clang >/dev/null 2>&1 || need+=(clang)
dpkg -s libclang-dev >/dev/null 2>&1 || need+=(libclang-dev)
if [ "${#need[@]}" -gt 0 ]; then
  echo "installing: ${need[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq "${need[@]}"
fi
