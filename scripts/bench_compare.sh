#!/usr/bin/env bash
# Runs one bench of several builds in turn, in one run, so that a before/after (or a bisect
# of a range of commits) comes from one machine state: each build's bench, then the next's,
# RUNS times over.
#
#   scripts/bench_compare.sh [-b BENCH] [-f FEATURES] [-n RUNS] [-p PREPARE] REV [REV...]
#
# Each REV is a git revision (a commit, a branch, HEAD~3). Given one, the working tree as it
# is (uncommitted changes included) is the second build. Each revision is checked out in a
# worktree under $COMPARE_DIR (default /tmp/pl-bench-compare) and built there with one
# target folder for all, so the dependencies build once. PREPARE is a shell command run
# before each run (say, dropping a table the builds share, so that none runs on what
# another left). Everything in the environment reaches the bench (PG_JOBS, PG_PATHS, ...).
# Each run's output is kept in $COMPARE_DIR/runs/, and the lines that carry figures are
# printed run by run at the end.
#
# Example: the Postgres queue bench of the commit before a change against the working tree,
# four runs each:
#
#   PG_JOBS=10000 PG_ROUNDS=1 PG_PATHS=0,1,2 scripts/bench_compare.sh -b postgres_queue \
#     -f postgres -n 4 -p 'psql -h 127.0.0.1 -U postgres -d test -qc "DROP TABLE IF EXISTS pl_queue_jobs"' HEAD~1
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

bench=postgres_queue
features=postgres
runs=3
prepare=""
while getopts "b:f:n:p:h" option; do
  case "$option" in
    b) bench=$OPTARG ;;
    f) features=$OPTARG ;;
    n) runs=$OPTARG ;;
    p) prepare=$OPTARG ;;
    *) sed -n '2,24p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
if [ $# -lt 1 ]; then
  echo "usage: $0 [-b BENCH] [-f FEATURES] [-n RUNS] [-p PREPARE] REV [REV...]" >&2
  exit 2
fi

dir=${COMPARE_DIR:-/tmp/pl-bench-compare}
mkdir -p "$dir/bin" "$dir/runs"
export CARGO_TARGET_DIR="$dir/target"

# Builds BENCH in `tree` and copies its executable to $dir/bin/`label`. Revisions before the
# benches had a crate of their own (benches/Cargo.toml) built them in the root package.
build() {
  local tree=$1 label=$2 executable package=()
  if [ -f "$tree/benches/Cargo.toml" ]; then
    package=(-p prometheus_parking_lot_benches)
  fi
  echo "building $bench ($features) of $label in $tree" >&2
  # The target folder is shared, and cargo checks a crate's sources by their paths relative
  # to the package and their times: a tree checked out before another tree's build ended
  # would look built already, and run the other tree's code. Newer sources rebuild it.
  find "$tree" -path "$tree/.git" -prune -o \( -name '*.rs' -o -name 'Cargo.toml' \) \
    -exec touch {} +
  if ! (cd "$tree" && cargo bench "${package[@]}" --features "$features" --bench "$bench" \
      --no-run --message-format=json >"$dir/build-$label.json" 2>"$dir/build-$label.log"); then
    echo "error: $bench of $label did not build; see $dir/build-$label.log" >&2
    exit 1
  fi
  executable=$(python3 -c 'import json,sys
for line in open(sys.argv[1]):
    message = json.loads(line)
    if message.get("reason") == "compiler-artifact" and message.get("executable"):
        print(message["executable"])' "$dir/build-$label.json" | tail -1)
  cp "$executable" "$dir/bin/$label"
}

# The tree of revision `rev`: a worktree at that commit, made once.
tree_of() {
  local rev=$1 commit
  commit=$(git rev-parse --verify "$rev^{commit}")
  local tree="$dir/trees/$commit"
  if [ ! -d "$tree" ]; then
    git worktree add --detach "$tree" "$commit" >/dev/null 2>&1
  fi
  echo "$tree"
}

labels=()
for rev in "$@"; do
  label="at-$(git rev-parse --short "$rev")"
  build "$(tree_of "$rev")" "$label"
  labels+=("$label")
done
if [ $# -eq 1 ]; then
  build "$root" "worktree"
  labels+=("worktree")
fi

stamp=$(date +%Y%m%d-%H%M%S)
for run in $(seq 1 "$runs"); do
  for label in "${labels[@]}"; do
    out="$dir/runs/$stamp-$run-$label.txt"
    echo "run $run of $runs: $label" >&2
    if [ -n "$prepare" ]; then
      bash -c "$prepare"
    fi
    if ! "$dir/bin/$label" --bench >"$out" 2>&1; then
      echo "run $run of $label failed; its output: $out" >&2
    fi
  done
done

echo
echo "$bench, $runs runs each, in turn ($stamp):"
for run in $(seq 1 "$runs"); do
  for label in "${labels[@]}"; do
    echo "== run $run, $label"
    grep -E "median|x the|jobs/s|/s " "$dir/runs/$stamp-$run-$label.txt" | grep -v "^|" || true
  done
done
