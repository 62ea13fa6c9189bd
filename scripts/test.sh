#!/usr/bin/env bash
# The whole test suite: every crate, every feature, doc tests included.
#
# Tests that talk to PostgreSQL use a real server (DATABASE_URL, default
# postgres://postgres@127.0.0.1:5432/test). When one is installed locally but stopped, this
# script starts it; when none can be reached, it stops with a message saying so.
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

cargo test --workspace --all-features --all-targets
cargo test --workspace --all-features --doc

# The real-NVML test again, with its report shown: the GPUs it found, or why it could not look.
cargo test --all-features --test gpu_nvml -- --nocapture

# The loom models of the parker and the slot budget (actors/tests/loom_*.rs), in their own
# target directory so the cfg(loom) build does not throw away the main build cache.
CARGO_TARGET_DIR=target/loom RUSTFLAGS="--cfg loom" \
  cargo test -p prometheus_parking_lot_actors --release --test loom_parker --test loom_budget
