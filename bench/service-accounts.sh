#!/usr/bin/env bash
# bench/service-accounts.sh: what service accounts cost (docs/service-accounts.md),
# authd pinned to CPU 0 with one hash thread and its other settings the defaults
# (the admin port on, for the accounts; 1,000 PBKDF2 rounds, for the setup's logins
# only), authbench on CPU 1. On one server, on
# SQLite, with BENCH_ACCOUNTS service accounts (one client secret each, created
# through the admin API before each run; requests take them in turn):
#   - client-credential grants (IssueServiceToken with a client secret): successful
#     grants per second and their p99, over gRPC and on the token endpoint (POST
#     /oauth2/token with HTTP Basic, a keep-alive HTTP/1.1 connection per request in
#     flight);
#   - token exchanges of users' access tokens for the accounts' audience: per second
#     and p99;
#   - ValidateToken of service tokens and of users' tokens, in turns (users' first,
#     then services', BENCH_ROUNDS times), and the ratio of their medians.
#
# Usage: bench/service-accounts.sh
# Environment: BENCH_CONCURRENCY [100], BENCH_DURATION [10], BENCH_WARMUP [3],
#   BENCH_ROUNDS [2], BENCH_ACCOUNTS [8], BENCH_USERS [100] (the users whose tokens
#   are exchanged or validated, and the service tokens validated), BENCH_LOG [info,
#   authd's default: an audit event per grant; warn leaves them out].
# Prints a Markdown table on stdout. The admin key is passed to authbench in its
# environment (AUTHBENCH_ADMIN_KEY), never on a command line.
set -euo pipefail

CONCURRENCY=${BENCH_CONCURRENCY:-100}
DURATION=${BENCH_DURATION:-10}
WARMUP=${BENCH_WARMUP:-3}
ROUNDS=${BENCH_ROUNDS:-2}
ACCOUNTS=${BENCH_ACCOUNTS:-8}
USERS=${BENCH_USERS:-100}
# Logins happen only in the setup (the users whose tokens are exchanged or
# validated): the lowest cost authd allows keeps it short.
ITERATIONS=1000

cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
source bench/lib.sh

# An admin key of the run's own: its SHA-256 in the keys file, the key itself only
# in authbench's environment.
AUTHBENCH_ADMIN_KEY=$(head -c 32 /dev/urandom | base64 -w0)
export AUTHBENCH_ADMIN_KEY
(umask 077 && printf 'bench admin %s\n' \
    "$(printf '%s' "$AUTHBENCH_ADMIN_KEY" | sha256sum | cut -d' ' -f1)" >"$WORK/admin-keys")
ADMIN_PORT=$(free_port)

# authd's own log level (info): each grant writes its audit event, as it does for
# users of the defaults.
start_pinned "$AUTHD" "sqlite://$WORK/authd.db" \
    AUTHD_ADMIN_LISTEN="127.0.0.1:$ADMIN_PORT" AUTHD_ADMIN_KEYS_FILE="$WORK/admin-keys" \
    AUTHD_LOG="${BENCH_LOG:-info}"

# measure SCENARIO [PROTOCOL]: "QPS P99" of its successful answers.
measure() {
    taskset -c 1 "$AUTHBENCH" "$1" --protocol "${2:-grpc}" --target "http://127.0.0.1:$PORT" \
        --admin "http://127.0.0.1:$ADMIN_PORT" --accounts "$ACCOUNTS" --users "$USERS" \
        --concurrency "$CONCURRENCY" --duration "${DURATION}s" --warmup "${WARMUP}s" --json \
        | python3 -c 'import json,sys; r=json.load(sys.stdin); l=r["ok_latency_ms"]
print("%.0f %.2f" % (r["ok_qps"], l["p99"] if l else 0))'
}

results="$WORK/results"
{
    echo "grant 1 $(measure grant)"
    echo "grant-json 1 $(measure grant json)"
    echo "exchange 1 $(measure exchange)"
    for round in $(seq "$ROUNDS"); do
        for scenario in validate validate-service; do
            echo "$scenario $round $(measure "$scenario")"
        done
    done
} >"$results"

python3 - "$results" "$CONCURRENCY" "$ACCOUNTS" <<'PY'
import statistics, sys
from collections import defaultdict
path, concurrency, accounts = sys.argv[1], sys.argv[2], sys.argv[3]
qps, p99 = defaultdict(list), defaultdict(list)
for line in open(path):
    scenario, _, rate, tail = line.split()
    qps[scenario].append(float(rate))
    p99[scenario].append(float(tail))
names = {
    "grant": f"IssueServiceToken, client credentials ({accounts} accounts)",
    "grant-json": f"POST /oauth2/token, client credentials ({accounts} accounts)",
    "exchange": f"IssueServiceToken, token exchange ({accounts} accounts)",
    "validate": "ValidateToken, users' tokens",
    "validate-service": "ValidateToken, service tokens",
}
print(f"| request, {concurrency} in flight | per second (successful) | p99 (ms) |")
print("|---|---:|---:|")
for scenario, name in names.items():
    print(f"| {name} | {statistics.median(qps[scenario]):.0f} | "
          f"{statistics.median(p99[scenario]):.2f} |")
ratio = statistics.median(qps["validate-service"]) / statistics.median(qps["validate"])
print()
print(f"ValidateToken, service ÷ user: {ratio:.2f}")
PY
