#!/usr/bin/env bash
# Both published crates as crates.io would receive them: each is packaged (its `include`
# list in its Cargo.toml says what goes in) and built from the package alone. The root crate
# depends on the engine by path and version; `cargo publish --workspace` builds it against
# the engine's package through a local registry, so neither needs to be on crates.io yet.
# Nothing is uploaded (--dry-run). The packages' sizes are printed at the end.
#
# --allow-dirty: the check is about what the packages hold and whether they build, so it
# also runs on a working tree with changes not committed yet.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo publish --dry-run --workspace --allow-dirty

# The sizes, of the files `cargo package` writes (the dry run keeps its own out of sight).
cargo package --workspace --exclude prometheus_parking_lot_benches --no-verify --allow-dirty --quiet
target_dir="${CARGO_TARGET_DIR:-target}"
for package in prometheus_parking_lot_actors prometheus_parking_lot; do
  crate_file=$(ls "${target_dir}/package/${package}"-[0-9]*.crate)
  files=$(tar -tzf "${crate_file}" | grep -vc '/$')
  echo "${package}: $(wc -c <"${crate_file}") bytes compressed, ${files} files"
done
