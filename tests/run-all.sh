#!/usr/bin/env bash
# The whole test suite, on a fresh Debian machine or a developer's one.
# Installs what is missing first, then checks formatting, lints and runs every
# test. Safe to run any number of times.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s\n' "$*"; }

if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo is required (install Rust with rustup, then run this again)" >&2
  exit 1
fi
if command -v rustup >/dev/null 2>&1; then
  for component in rustfmt clippy; do
    if ! rustup component list --installed 2>/dev/null | grep -q "^${component}"; then
      log "installing rustup component ${component}"
      rustup component add "${component}"
    fi
  done
fi

log "cargo fmt --check"
cargo fmt --all -- --check

log "cargo clippy (warnings are errors)"
cargo clippy --locked --all-targets -- -D warnings

log "cargo test"
cargo test --locked --all-targets
