#!/usr/bin/env bash
# Our Postgres bench beside two other Postgres job queues, on the same server and database, with
# the same work per job (see README.md beside this script): jobs/s per path, per run, and each
# peer path's ratio to our pool's paths.
#
#   benches/peers/run.sh                       # PEER_RUNS=2 runs of PG_JOBS=10000 jobs per path
#   PEER_RUNS=3 PG_JOBS=20000 benches/peers/run.sh
#   PEER_RUNS=1 PG_JOBS=2000 benches/peers/run.sh    # a quick look, not a measurement
#
# It builds our bench (cargo bench --no-run, feature `postgres`), the pg-boss script (npm ci) and
# the apalis crate (cargo build --release), then runs PEER_RUNS times: our bench (paths 0,1,2:
# the plain SKIP LOCKED loop, pool submit_batch, pool submit), pg-boss (insert, send) and apalis
# (push_all, push_task), one round each, starting each run with the next system so none always
# goes first. Before every run it drops the peers' schemas (pgboss, apalis) so nothing grows
# across runs; our bench drops its own tables after each round.
#
# Environment: PEER_RUNS (2); PG_JOBS (10000), PG_WORKERS (2), PG_CLIENTS (64), passed to all
# three; PEER_DATABASE (bench_peers) on the server at 127.0.0.1:5432, user postgres, created if
# missing. Use a database of its own: the peers create schemas and tables in it. Logs go to
# target/peers/.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
runs=${PEER_RUNS:-2}
database=${PEER_DATABASE:-bench_peers}
export PG_JOBS=${PG_JOBS:-10000} PG_WORKERS=${PG_WORKERS:-2} PG_CLIENTS=${PG_CLIENTS:-64}
export PG_ROUNDS=1
export DATABASE_URL="postgres://postgres@127.0.0.1:5432/$database"
psql_admin=(psql -h 127.0.0.1 -U postgres -v ON_ERROR_STOP=1 -qAt)
logs=target/peers
mkdir -p "$logs"

if [ -z "$("${psql_admin[@]}" -d postgres -c "SELECT 1 FROM pg_database WHERE datname = '$database'")" ]; then
    "${psql_admin[@]}" -d postgres -c "CREATE DATABASE $database"
fi

echo "building our bench, pg-boss and apalis" >&2
nice cargo bench -p prometheus_parking_lot_benches --bench postgres_queue --features postgres --no-run
(cd benches/peers/pgboss && nice npm ci --no-audit --no-fund --loglevel=error >&2)
nice cargo build --release --manifest-path benches/peers/apalis/Cargo.toml

ours() {
    PG_PATHS=0,1,2 cargo bench -q -p prometheus_parking_lot_benches --bench postgres_queue \
        --features postgres
}
pgboss() { node benches/peers/pgboss/bench.js; }
apalis() { benches/peers/apalis/target/release/peers-apalis; }
systems=(ours pgboss apalis)

# One line per path and run, "run<TAB>system<TAB>path<TAB>jobs/s", from the "  <path> median
# <n> jobs/s" lines each program prints.
results="$logs/results.tsv"
: >"$results"
for run in $(seq 1 "$runs"); do
    "${psql_admin[@]}" -d "$database" -c \
        "DROP SCHEMA IF EXISTS pgboss CASCADE; DROP SCHEMA IF EXISTS apalis CASCADE;
         DROP TABLE IF EXISTS public._sqlx_migrations;" 2>/dev/null
    for k in 0 1 2; do
        system=${systems[(run - 1 + k) % 3]}
        log="$logs/run$run-$system.log"
        echo "run $run/$runs: $system" >&2
        if ! "$system" >"$log" 2>&1; then
            echo "  $system failed; see $log" >&2
            continue
        fi
        sed -nE 's/^  (.*[^ ]) +median +([0-9.]+) jobs\/s.*/\1\t\2/p' "$log" |
            while IFS=$'\t' read -r path rate; do
                printf '%s\t%s\t%s\t%s\n' "$run" "${system/pgboss/pg-boss}" "$path" "$rate"
            done >>"$results"
    done
done

echo
echo "$PG_JOBS jobs per run, $PG_WORKERS workers, $PG_CLIENTS clients, $runs runs on database" \
    "$database (ratios are of medians over the runs; our paths as benches/postgres_queue.rs):"
echo
awk -F'\t' -v runs="$runs" '
    function median(key,    n, i, j, t, v) {
        n = 0
        for (i = 1; i <= runs; i++) if ((i, key) in rate) v[++n] = rate[i, key]
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
        return n ? v[int(n / 2) + 1] : 0
    }
    function ratio(x, y) { return (x && y) ? sprintf("%.2fx", x / y) : "–" }
    {
        key = $2 SUBSEP $3
        if (!(key in seen)) { seen[key] = 1; order[++paths] = key }
        rate[$1, key] = $4
    }
    END {
        batch = median("ours" SUBSEP "pool, submit_batch")
        single = median("ours" SUBSEP "pool, submit")
        plain = median("ours" SUBSEP "plain SQL SKIP LOCKED loop")
        header = "| system | path |"; rule = "|---|---|"
        for (i = 1; i <= runs; i++) { header = header " run " i " |"; rule = rule "---:|" }
        print header " median jobs/s | vs our pool, submit_batch | vs our pool, submit | vs plain SQL loop |"
        print rule "---:|---:|---:|---:|"
        for (p = 1; p <= paths; p++) {
            split(order[p], part, SUBSEP)
            line = "| " part[1] " | " part[2] " |"
            for (i = 1; i <= runs; i++) line = line " " (((i, order[p]) in rate) ? sprintf("%.0f", rate[i, order[p]]) : "–") " |"
            m = median(order[p])
            print line " " sprintf("%.0f", m) " | " ratio(m, batch) " | " ratio(m, single) " | " ratio(m, plain) " |"
        }
    }' "$results"
