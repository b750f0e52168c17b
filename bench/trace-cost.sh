#!/usr/bin/env bash
# bench/trace-cost.sh: what tracing costs while the collector is down. In one run,
# pinned as bench/seed-table.sh pins (the server on CPU 0 with one hash thread,
# authbench on CPU 1), alternating ROUNDS times, each on a fresh server and SQLite
# file: ValidateToken and Login QPS with tracing off, and with tracing on and the
# collector down (OTEL_EXPORTER_OTLP_ENDPOINT on a closed local port). The spans
# dropped and the requests left untraced (tracing paused) are read from /metrics.
# Prints a Markdown table on stdout.
#
# Usage: bench/trace-cost.sh
# Environment: BENCH_DURATION [15], BENCH_WARMUP [5], BENCH_ROUNDS [3],
#   BENCH_CONCURRENCY [50], BENCH_ITERATIONS (PBKDF2 cost for logins) [10000].
# Needs: cargo, taskset, python3, curl.
set -euo pipefail

DURATION=${BENCH_DURATION:-15}
WARMUP=${BENCH_WARMUP:-5}
ROUNDS=${BENCH_ROUNDS:-3}
CONCURRENCY=${BENCH_CONCURRENCY:-50}
ITERATIONS=${BENCH_ITERATIONS:-10000}

cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
source bench/lib.sh

# start MODE NAME: a fresh server (MODE off or down), waited for until it answers.
start() {
    METRICS_PORT=$(free_port)
    local otel=()
    # A port nothing listens on: the collector is down.
    [[ $1 == down ]] && otel=(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$(free_port)")
    start_pinned "$AUTHD" "sqlite://$WORK/$2.db" \
        AUTHD_METRICS_LISTEN="127.0.0.1:$METRICS_PORT" "${otel[@]}"
}

# metric NAME: its value on the running server.
metric() {
    curl -fsS "http://127.0.0.1:$METRICS_PORT/metrics" | awk -v m="$1" '$1 == m { print $2 }'
}

echo "| RPC | round | tracing off | collector down | ratio | spans dropped | requests untraced |"
echo "|---|---|---:|---:|---:|---:|---:|"
for round in $(seq "$ROUNDS"); do
    for scenario in validate login; do
        start off "off-$scenario-$round"
        off=$(bench "$scenario")
        stop
        start down "down-$scenario-$round"
        down=$(bench "$scenario")
        dropped=$(metric authd_trace_spans_dropped_total)
        untraced=$(metric authd_trace_requests_untraced_total)
        stop
        ratio=$(python3 -c "print(f'{$down / $off:.2f}×')")
        echo "| $scenario | $round | $off | $down | $ratio | $dropped | $untraced |"
    done
done
