#!/usr/bin/env bash
# Both published crates as crates.io would receive them: each is packaged (its `include`
# list in its Cargo.toml says what goes in) and built from the package alone. The root crate
# depends on the engine by path and version; `cargo publish --workspace` builds it against
# the engine's package through a local registry, so neither needs to be on crates.io yet.
# Nothing is uploaded (--dry-run). The packages' sizes are printed at the end.
#
# Then the docs as docs.rs builds them ([package.metadata.docs.rs]: every feature, nightly
# rustdoc with `--cfg docsrs`, which turns on the badges naming each item's feature), when a
# nightly toolchain is installed; where none is, the step says so.
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

if rustup run nightly rustdoc --version >/dev/null 2>&1; then
  RUSTDOCFLAGS="--cfg docsrs -D warnings" cargo +nightly doc -p prometheus_parking_lot \
    --all-features --no-deps
else
  echo "the docs.rs build NOT checked: no nightly toolchain (rustup toolchain install nightly)"
fi
