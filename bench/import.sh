#!/usr/bin/env bash
# bench/import.sh: what `authd admin users import` costs (docs/migration.md), on a
# fresh SQLite database each time, authd pinned to CPU 0 with one hash thread and its
# other settings the defaults, its clients (the import CLI, authbench) on CPU 1:
#
# - users imported per second from one file of BENCH_IMPORT_USERS records (the
#   fixtures' formats in turn, tests/fixtures/foreign-hashes), and from the same file
#   again (every line unchanged);
# - logins per second (authbench, BENCH_CONCURRENCY in flight, PBKDF2 at
#   BENCH_ITERATIONS) without an import, then while a file of
#   BENCH_BACKGROUND_USERS records is imported beside them, and their ratio.
#
# Usage: bench/import.sh
# Environment: BENCH_IMPORT_USERS [100000], BENCH_BACKGROUND_USERS [2000000],
#   BENCH_ITERATIONS [10000], BENCH_CONCURRENCY [100], BENCH_DURATION [10],
#   BENCH_WARMUP [3].
# Prints a Markdown table on stdout.
set -euo pipefail

IMPORT_USERS=${BENCH_IMPORT_USERS:-100000}
BACKGROUND_USERS=${BENCH_BACKGROUND_USERS:-2000000}
ITERATIONS=${BENCH_ITERATIONS:-10000}
CONCURRENCY=${BENCH_CONCURRENCY:-100}
DURATION=${BENCH_DURATION:-10}
WARMUP=${BENCH_WARMUP:-3}

cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
source bench/lib.sh

ADMIN_KEY="bench-import-$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
# The keys file names a key's SHA-256, never the key (docs/admin.md).
echo "bench admin $(printf '%s' "$ADMIN_KEY" | sha256sum | cut -d' ' -f1)" >"$WORK/admin-keys"

# users FILE COUNT PREFIX: COUNT import records named PREFIX000000…, their hashes the
# fixtures' in turn.
users() {
    python3 - "$1" "$2" "$3" <<'EOF'
import json, sys
path, count, prefix = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with open("tests/fixtures/foreign-hashes/foreign-hashes.jsonl") as f:
    hashes = [json.loads(line)["hash"] for line in f]
with open(path, "w") as out:
    for i in range(count):
        record = {"username": f"{prefix}{i:07d}", "password_hash": hashes[i % len(hashes)]}
        out.write(json.dumps(record, separators=(",", ":")) + "\n")
EOF
}

# start: a fresh authd on CPU 0 with a new SQLite file and an admin port.
start() {
    rm -f "$WORK"/authd.db*
    ADMIN_PORT=$(free_port)
    start_pinned "$AUTHD" "sqlite://$WORK/authd.db" \
        AUTHD_ADMIN_LISTEN="127.0.0.1:$ADMIN_PORT" AUTHD_ADMIN_KEYS_FILE="$WORK/admin-keys" \
        AUTHD_REGISTER_LIMIT=off
}

# import FILE: the CLI on CPU 1; prints its lines per second (from its summary).
import() {
    AUTHD_ADMIN_KEY=$ADMIN_KEY taskset -c 1 "$AUTHD" admin --addr "127.0.0.1:$ADMIN_PORT" \
        users import "$1" --on-conflict skip 2>&1 |
        sed -n 's/.* \([0-9][0-9]*\) lines\/s.*/\1/p' | tail -n 1
}

users "$WORK/users.jsonl" "$IMPORT_USERS" import
users "$WORK/background.jsonl" "$BACKGROUND_USERS" background

echo "CPU: $(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo), $(nproc) cores"
echo
start
first=$(import "$WORK/users.jsonl")
again=$(import "$WORK/users.jsonl")
stop
start
alone=$(bench login)
import "$WORK/background.jsonl" >"$WORK/background.rate" &
IMPORTING=$!
beside=$(bench login)
if kill -0 "$IMPORTING" 2>/dev/null; then
    still="yes"
else
    still="no: raise BENCH_BACKGROUND_USERS"
fi
wait "$IMPORTING" || true
stop

echo "| measure | value |"
echo "|---|---:|"
echo "| users imported per second, $IMPORT_USERS new | $first |"
echo "| users imported per second, the same file again (unchanged) | $again |"
echo "| logins per second, PBKDF2 $ITERATIONS, $CONCURRENCY in flight, no import | $alone |"
echo "| the same, beside an import of $BACKGROUND_USERS users | $beside |"
echo "| ratio | $(python3 -c "print(f'{$beside / $alone:.2f}')") |"
echo "| the import still running when the logins' measurement ended | $still |"
echo "| that import's users per second | $(cat "$WORK/background.rate") |"
