#!/usr/bin/env bash
# Builds the Postgres examples the way a crate that depends on this one builds them: a
# throwaway crate outside this workspace, depending on this checkout by path, with no [patch]
# of its own. Runs examples/enqueue_latency.rs there (and checks that examples/cluster.rs
# builds), so the latency a user gets can be compared with this workspace's benchmarks.
#
#   scripts/downstream_latency.sh            # this checkout
#   scripts/downstream_latency.sh /path/to/other/checkout
#
# DATABASE_URL as for the tests (default postgres://postgres@127.0.0.1:5432/test); PROFILE
# (release or dev, default release) and CARGO_TARGET_DIR are honoured.
set -euo pipefail
checkout="$(cd "${1:-$(dirname "$0")/..}" && pwd)"
profile="${PROFILE:-release}"
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"

crate="$(mktemp -d)"
trap 'rm -rf "$crate"' EXIT
mkdir -p "$crate/src/bin"
cp "$checkout/examples/cluster.rs" "$checkout/examples/enqueue_latency.rs" "$crate/src/bin/"
cp "$checkout/Cargo.lock" "$crate/Cargo.lock"
cat > "$crate/Cargo.toml" <<TOML
[package]
name = "parking-lot-downstream"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
prometheus_parking_lot = { path = "$checkout", features = ["postgres"] }
async-trait = "0.1"
serde = { version = "1", features = ["derive"] }
serde_json = "1"
tokio = { version = "1", features = ["rt", "rt-multi-thread", "macros", "time"] }
TOML

cd "$crate"
cargo build --profile "$profile" --bins
cargo run --profile "$profile" --quiet --bin enqueue_latency
