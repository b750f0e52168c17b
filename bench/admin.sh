#!/usr/bin/env bash
# bench/admin.sh: what the admin API costs, in one run per backend
# (examples/admin_bench.rs): ListUsers with a page of 100 over BENCH_USERS accounts
# (the first page, a page in the middle, a prefix), and ValidateToken calls a second
# before and after BENCH_DISABLED accounts are disabled. authd and its client run in
# one process; compare the rows of one run.
#
# Usage: bench/admin.sh
# Environment: BENCH_USERS [1000000], BENCH_DISABLED [10000], BENCH_DURATION [10s],
#   BENCH_POSTGRES_URL [unset: SQLite only; set: also PostgreSQL, on a fresh schema
#   that is dropped afterwards (needs psql)].
# Prints a Markdown table per backend on stdout.
set -euo pipefail

USERS=${BENCH_USERS:-1000000}
DISABLED=${BENCH_DISABLED:-10000}
DURATION=${BENCH_DURATION:-10s}
PG_URL=${BENCH_POSTGRES_URL:-}

cd "$(dirname "$0")/.."
cargo build --release --locked --example admin_bench >&2
BIN=${CARGO_TARGET_DIR:-target}/release/examples/admin_bench
WORK=$(mktemp -d "${TMPDIR:-/tmp}/authd-admin-bench.XXXXXX")
SCHEMA=
cleanup() {
    [[ -n $SCHEMA ]] && psql -q "$PG_URL" -c "DROP SCHEMA IF EXISTS $SCHEMA CASCADE" >/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT

echo "CPU: $(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo), $(nproc) cores"
echo
echo "### SQLite"
echo
"$BIN" --database-url "sqlite://$WORK/admin.db" --users "$USERS" --disabled "$DISABLED" \
    --duration "$DURATION"
if [[ -n $PG_URL ]]; then
    command -v psql >/dev/null || { echo "bench/admin.sh: BENCH_POSTGRES_URL needs psql" >&2; exit 1; }
    SCHEMA="authd_admin_bench_$$"
    psql -q "$PG_URL" -c "CREATE SCHEMA $SCHEMA" >/dev/null
    sep='?'
    [[ $PG_URL == *\?* ]] && sep='&'
    echo
    echo "### PostgreSQL"
    echo
    "$BIN" --database-url "$PG_URL${sep}options[search_path]=$SCHEMA" --users "$USERS" \
        --disabled "$DISABLED" --duration "$DURATION"
fi
