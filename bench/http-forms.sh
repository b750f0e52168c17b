#!/usr/bin/env bash
# bench/http-forms.sh: what authd's HTTP forms cost beside gRPC (docs/api.md), authd
# pinned to CPU 0 with one hash thread and its other settings the defaults, authbench
# on CPU 1. On one server, in turns (gRPC, JSON, gRPC-Web, then again), for each of
# Login at BENCH_ITERATIONS PBKDF2 iterations and ValidateToken: successful answers
# per second over gRPC (HTTP/2, shared connections) and over JSON and gRPC-Web
# (HTTP/1.1, a keep-alive connection per request in flight, as curl and browsers
# call), and each form's ratio to gRPC (the median of its rounds over gRPC's).
#
# Usage: bench/http-forms.sh
# Environment: BENCH_ITERATIONS [10000], BENCH_CONCURRENCY [100], BENCH_DURATION [10],
#   BENCH_WARMUP [3], BENCH_ROUNDS [2].
# Prints a Markdown table on stdout.
set -euo pipefail

ITERATIONS=${BENCH_ITERATIONS:-10000}
CONCURRENCY=${BENCH_CONCURRENCY:-100}
DURATION=${BENCH_DURATION:-10}
WARMUP=${BENCH_WARMUP:-3}
ROUNDS=${BENCH_ROUNDS:-2}

cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
source bench/lib.sh

start_pinned "$AUTHD" "sqlite://$WORK/authd.db"

# over PROTOCOL SCENARIO: successful answers per second.
over() {
    taskset -c 1 "$AUTHBENCH" "$2" --protocol "$1" --target "http://127.0.0.1:$PORT" \
        --concurrency "$CONCURRENCY" --duration "${DURATION}s" --warmup "${WARMUP}s" --json \
        | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["ok_qps"]))'
}

results="$WORK/results"
for scenario in login validate; do
    for round in $(seq "$ROUNDS"); do
        for protocol in grpc json grpc-web; do
            echo "$scenario $protocol $round $(over "$protocol" "$scenario")" >>"$results"
        done
    done
done

python3 - "$results" "$ITERATIONS" "$CONCURRENCY" <<'PY'
import statistics, sys
from collections import defaultdict
path, iterations, concurrency = sys.argv[1], sys.argv[2], sys.argv[3]
runs = defaultdict(list)
for line in open(path):
    scenario, protocol, _, qps = line.split()
    runs[scenario, protocol].append(int(qps))
names = {"login": f"Login (PBKDF2 {int(iterations):,} iterations)", "validate": "ValidateToken"}
print(f"| request | gRPC (/s) | JSON (/s) | JSON ÷ gRPC | gRPC-Web (/s) | gRPC-Web ÷ gRPC |")
print("|---|---:|---:|---:|---:|---:|")
for scenario in ("login", "validate"):
    grpc = statistics.median(runs[scenario, "grpc"])
    json_ = statistics.median(runs[scenario, "json"])
    web = statistics.median(runs[scenario, "grpc-web"])
    print(f"| {names[scenario]}, {concurrency} in flight | {grpc:.0f} | {json_:.0f} | "
          f"{json_ / grpc:.2f} | {web:.0f} | {web / grpc:.2f} |")
PY
