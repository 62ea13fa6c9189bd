#!/usr/bin/env bash
# The whole test suite, for every feature set a user can build:
#
# - the suite with the default features (what `cargo test` gives a fresh clone), then with
#   every feature, doc tests included;
# - each cargo feature of the root crate on its own, and none at all: built with its tests,
#   examples and benches (the crate in benches/), and linted, so code that only one feature
#   set compiles cannot rot;
# - the real-NVML test with its report shown, and the loom models.
#
# Tests that talk to PostgreSQL use a real server (DATABASE_URL, default
# postgres://postgres@127.0.0.1:5432/test). When one is installed locally but stopped, this
# script starts it; when none can be reached, it stops with a message saying so.
#
# The admin dashboard's test (tests/admin_dashboard.rs) drives headless Chromium through
# chromedriver. This script installs the Debian packages chromium and chromium-driver when
# /usr/bin/chromedriver is missing, and sets PL_REQUIRE_BROWSER=1 so that the test fails
# rather than skips without them.
set -euo pipefail
cd "$(dirname "$0")/.."

export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"

postgres_reachable() {
  if command -v pg_isready >/dev/null 2>&1; then
    pg_isready -q -h 127.0.0.1 -p 5432
  else
    (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null
  fi
}

if ! postgres_reachable; then
  if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
    echo "PostgreSQL is installed but not running; starting it"
    for version in /etc/postgresql/*; do
      pg_ctlcluster --skip-systemctl-redirect "$(basename "$version")" main start || true
    done
    for _ in $(seq 1 30); do postgres_reachable && break; sleep 1; done
  fi
fi
if ! postgres_reachable; then
  echo "error: no PostgreSQL server at 127.0.0.1:5432; install one or set DATABASE_URL" >&2
  exit 1
fi

# Runs a command as root: directly when this script is root, else through sudo.
as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

install_browser() {
  as_root env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y --no-install-recommends chromium chromium-driver
}

if [ ! -x /usr/bin/chromedriver ]; then
  echo "chromedriver is missing; installing the Debian packages chromium and chromium-driver"
  # The package lists may be empty (a fresh container) or stale: refresh them if needed.
  install_browser || { as_root apt-get update && install_browser; }
fi
export PL_REQUIRE_BROWSER=1
# tests/postgres_restart.rs restarts the local server through pg_ctlcluster; where this script
# can, it must (rather than say it did nothing).
if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
  export PL_REQUIRE_RESTART=1
fi

section() { printf '\n=== %s\n' "$*"; }

section "the suite with the default features"
cargo test --workspace --all-targets
cargo test --workspace --doc

section "the suite with every feature"
cargo test --workspace --all-features --all-targets
cargo test --workspace --all-features --doc

# The features of the root crate, read from its manifest: the names in [features] but
# `default`.
root_features() {
  sed -n '/^\[features\]/,/^\[/p' Cargo.toml | sed -n 's/^\([a-z0-9_-]*\) *=.*/\1/p' | grep -vx default
}

# The benches' crate (benches/Cargo.toml) has the same features, each turning on the root's.
section "each feature on its own"
for feature in "" $(root_features); do
  echo "--no-default-features ${feature:+--features $feature}"
  cargo clippy -p prometheus_parking_lot -p prometheus_parking_lot_benches \
    --no-default-features ${feature:+--features "$feature"} --all-targets --quiet -- -D warnings
done

section "the real-NVML test, with its report: the GPUs it found, or why it could not look"
cargo test --all-features --test gpu_nvml -- --nocapture

# The loom models of the parker and the slot budget (actors/tests/loom_*.rs), in a target
# directory of their own (inside the caller's CARGO_TARGET_DIR when one is set) so the
# cfg(loom) build does not throw away the main build cache.
section "the loom models"
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/loom" RUSTFLAGS="--cfg loom" \
  cargo test -p prometheus_parking_lot_actors --release --test loom_parker --test loom_budget --test loom_grant --test loom_lane
