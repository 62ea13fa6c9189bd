#!/usr/bin/env bash
# Runs every benchmark of the workspace and rewrites BENCHMARKS.md's measured section.
#
#   scripts/bench.sh                  every bench, full scale; rewrites BENCHMARKS.md
#   scripts/bench.sh end_to_end ...   only the benches named; their blocks are rewritten
#   BENCH_SMOKE=1 scripts/bench.sh    each bench at its small smoke scale (the binary run
#                                     without --bench: checks the script and the benches;
#                                     the figures mean nothing and BENCHMARKS.md is kept)
#   BENCH_DRY=1 scripts/bench.sh      writes the report to target/bench-report/ only
#
# The benches are found from the manifests' [[bench]] entries (benches/Cargo.toml, the crate
# prometheus_parking_lot_benches), so a new bench is picked up without editing this script.
# Each runs with --all-features (the Postgres benches need DATABASE_URL, default
# postgres://postgres@127.0.0.1:5432/test). Each bench prints its tables with its baseline
# measured in the same run and the ratio; this script keeps every table line (and, for a
# bench that prints a "markdown for BENCHMARKS.md:" section, that section) and stamps it
# with the machine, the date and the toolchain.
#
# BENCHMARKS.md keeps its prose; each bench's figures live between
#   <!-- bench.sh:begin NAME --> and <!-- bench.sh:end NAME -->
# markers (appended under "Latest run" the first time). Nothing is written unless every
# bench asked for succeeded: a failed bench leaves the file as it was and the script
# exits non-zero naming it.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-1}"
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"
report_dir="$root/target/bench-report"
mkdir -p "$report_dir"

# Every bench target named in a manifest of the workspace, as "PACKAGE BENCH".
discover() {
    for manifest in Cargo.toml */Cargo.toml; do
        [ -f "$manifest" ] || continue
        awk '
            function value() { sub(/^name[ \t]*=[ \t]*"/, ""); sub(/".*$/, ""); return $0 }
            /^\[package\]/ { section = "package"; next }
            /^\[\[bench\]\]/ { section = "bench"; next }
            /^\[/ { section = ""; next }
            section == "package" && /^name[ \t]*=/ { package = value() }
            section == "bench" && /^name[ \t]*=/ { print package, value() }
        ' "$manifest"
    done
}

# The package of each bench, by the bench's name.
declare -A package_of
all=()
while read -r package bench; do
    package_of[$bench]="$package"
    all+=("$bench")
done < <(discover)
if [ "${#all[@]}" -eq 0 ]; then
    echo "bench.sh: no [[bench]] entries found in the manifests" >&2
    exit 2
fi
if [ "$#" -gt 0 ]; then
    benches=("$@")
    for wanted in "${benches[@]}"; do
        if ! printf '%s\n' "${all[@]}" | grep -qx -- "$wanted"; then
            echo "bench.sh: no bench named $wanted; the benches are: ${all[*]}" >&2
            exit 2
        fi
    done
else
    benches=("${all[@]}")
fi

cpu="$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null || true)"
[ -n "$cpu" ] || cpu="$(uname -m)"
cores="$(nproc 2>/dev/null || echo '?')"
load="$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')"
today="$(date -u +%Y-%m-%d)"
rustc_version="$(rustc --version)"
commit="$(git rev-parse --short HEAD 2>/dev/null || echo '?')"

# The lines of a bench's output that belong in the report: its "markdown for
# BENCHMARKS.md:" section when it prints one, else every table line and the title line
# just above each table.
extract() {
    awk '
        /^markdown for BENCHMARKS.md:/ { section = 1; next }
        section { print; next }
        /^\|/ {
            if (!in_table && previous != "" && previous !~ /^\|/) { print ""; print previous }
            if (!in_table) print ""
            in_table = 1; print; previous = $0; next
        }
        { in_table = 0; previous = $0 }
    ' "$1" | awk 'NF || printed { print; printed = 1 }'
}

# Runs one bench: measured (cargo bench passes --bench), or at its smoke scale (the same
# binary run without --bench).
run_bench() {
    local package="${package_of[$1]}"
    if [ -z "${BENCH_SMOKE:-}" ]; then
        cargo bench -p "$package" --all-features --bench "$1"
        return
    fi
    local exe
    exe="$(cargo bench -p "$package" --all-features --bench "$1" --no-run --message-format=json |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)"
    [ -n "$exe" ] || { echo "no executable for bench $1" >&2; return 1; }
    "$exe"
}

failed=()
for bench in "${benches[@]}"; do
    log="$report_dir/$bench.log"
    command=(cargo bench -p "${package_of[$bench]}" --all-features --bench "$bench")
    echo "== $bench: ${command[*]}${BENCH_SMOKE:+ (smoke scale)}"
    if run_bench "$bench" >"$log" 2>"$report_dir/$bench.err"; then
        {
            echo "### \`$bench\`"
            echo
            echo "\`${command[*]}\` on $cpu, $cores cores (load average $load at the start), $today, $rustc_version, commit $commit."
            echo
            extract "$log"
        } >"$report_dir/$bench.md"
        if [ "$(grep -c '^|' "$report_dir/$bench.md")" -eq 0 ]; then
            echo "   $bench printed no table; see $log" >&2
            failed+=("$bench")
        fi
    else
        echo "   $bench failed; see $report_dir/$bench.err" >&2
        failed+=("$bench")
    fi
done

if [ "${#failed[@]}" -gt 0 ]; then
    echo "bench.sh: ${failed[*]} failed; BENCHMARKS.md is unchanged" >&2
    exit 1
fi
if [ -n "${BENCH_DRY:-}" ] || [ -n "${BENCH_SMOKE:-}" ]; then
    echo "bench.sh: reports in $report_dir (BENCHMARKS.md is unchanged in smoke and dry runs)"
    exit 0
fi

# Rewrites (or appends) each bench's block between its markers.
target="$root/BENCHMARKS.md"
for bench in "${benches[@]}"; do
    begin="<!-- bench.sh:begin $bench -->"
    end="<!-- bench.sh:end $bench -->"
    if ! grep -qxF -- "$begin" "$target"; then
        grep -qx '## Latest run (scripts/bench.sh)' "$target" ||
            printf '\n## Latest run (scripts/bench.sh)\n\nWritten by `scripts/bench.sh`: every figure beside its baseline from the same run.\n' >>"$target"
        printf '\n%s\n%s\n' "$begin" "$end" >>"$target"
    fi
    awk -v begin="$begin" -v end="$end" -v block="$report_dir/$bench.md" '
        $0 == begin { print; while ((getline line < block) > 0) print line; skipping = 1; next }
        $0 == end { skipping = 0 }
        !skipping { print }
    ' "$target" >"$target.new"
    mv "$target.new" "$target"
done
echo "bench.sh: BENCHMARKS.md rewritten for ${benches[*]}"
