#!/usr/bin/env bash
# The supply-chain checks: the rust-version the crates declare against what their
# dependencies need (scripts/check_rust_version.py); then, with cargo-deny and the rules of
# deny.toml, the licences of every dependency, banned crates and duplicate versions, and where
# crates come from (crates.io only); then the RustSec advisories, when the advisory database
# (a git repository on github.com) can be fetched. Where it cannot, the step says so and goes
# on: an offline machine checks everything else.
#
# cargo-deny is installed (`cargo install --locked`, a few minutes) when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_DENY_VERSION=0.20.2

if command -v python3 >/dev/null 2>&1; then
  scripts/check_rust_version.py
else
  echo "rust-version NOT checked: python3 is missing"
fi

if ! command -v cargo-deny >/dev/null 2>&1; then
  echo "cargo-deny is missing; installing cargo-deny ${CARGO_DENY_VERSION}"
  cargo install --locked --version "${CARGO_DENY_VERSION}" cargo-deny
fi

cargo deny check licenses bans sources

if timeout 180 cargo deny fetch db; then
  cargo deny check --disable-fetch advisories
else
  echo "advisories NOT checked: the RustSec advisory database (https://github.com/RustSec/advisory-db)" \
    "could not be fetched from this machine"
fi
