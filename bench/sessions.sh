#!/usr/bin/env bash
# bench/sessions.sh: what sessions cost. In one run, pinned as bench/seed-table.sh
# pins (the server on CPU 0 with one hash thread, authbench on CPU 1):
#   - ValidateToken QPS of a baseline authd (BENCH_BASELINE_AUTHD, e.g. built from
#     main in a `git worktree`) and of this tree's, alternating ROUNDS times, each on
#     a fresh server and SQLite file: the revocation check must cost under 10%;
#   - Login and Refresh QPS of this tree's authd on SQLite, and on PostgreSQL when
#     BENCH_POSTGRES_URL is set (a fresh schema per row, dropped afterwards).
# Prints a Markdown table on stdout.
#
# Usage: BENCH_BASELINE_AUTHD=/path/to/main/authd bench/sessions.sh
# Environment: BENCH_DURATION [15], BENCH_WARMUP [5], BENCH_ROUNDS [3],
#   BENCH_CONCURRENCY [50], BENCH_ITERATIONS (PBKDF2 cost for logins) [10000],
#   BENCH_POSTGRES_URL [unset], BENCH_BASELINE_AUTHD [unset: no baseline rows].
# Needs: cargo, taskset, python3 (and psql for PostgreSQL).
set -euo pipefail

DURATION=${BENCH_DURATION:-15}
WARMUP=${BENCH_WARMUP:-5}
ROUNDS=${BENCH_ROUNDS:-3}
CONCURRENCY=${BENCH_CONCURRENCY:-50}
ITERATIONS=${BENCH_ITERATIONS:-10000}
PG_URL=${BENCH_POSTGRES_URL:-}
BASELINE=${BENCH_BASELINE_AUTHD:-}

cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
source bench/lib.sh

# start BINARY DATABASE_URL: a fresh server, waited for until it answers.
start() { start_pinned "$@"; }

row() { echo "| $1 | $2 | $3 |"; }

echo "| scenario | authd | successful QPS |"
echo "|---|---|---:|"
for round in $(seq "$ROUNDS"); do
    if [[ -n $BASELINE ]]; then
        start "$BASELINE" "sqlite://$WORK/base-$round.db"
        row "validate (round $round)" baseline "$(bench validate)"
        stop
    fi
    start "$AUTHD" "sqlite://$WORK/this-$round.db"
    row "validate (round $round)" "this tree" "$(bench validate)"
    stop
done
for scenario in login refresh; do
    start "$AUTHD" "sqlite://$WORK/$scenario.db"
    row "$scenario, SQLite" "this tree" "$(bench "$scenario")"
    stop
    if [[ -n $PG_URL ]]; then
        schema="bench_sessions_$$_$scenario"
        psql -q "$PG_URL" -c "CREATE SCHEMA $schema"
        sep='?'
        [[ $PG_URL == *\?* ]] && sep='&'
        start "$AUTHD" "$PG_URL${sep}options[search_path]=$schema"
        row "$scenario, PostgreSQL" "this tree" "$(bench "$scenario")"
        stop
        psql -q "$PG_URL" -c "DROP SCHEMA $schema CASCADE"
    fi
done
