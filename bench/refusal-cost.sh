#!/usr/bin/env bash
# bench/refusal-cost.sh: what one refusal costs the server, the figure that decides
# how much of a core a crowd of clients that re-ask at once takes from the work
# admitted (docs/operations.md#overload). In one run, pinned as bench/seed-table.sh
# pins (the server on CPU 0 with one hash thread, authbench on CPU 1), each round on
# a fresh server and SQLite file: Logins at the default PBKDF2 cost with a deadline
# shorter than one batch of hashing, so that all but the one login admitted at a time
# are refused for their deadline and held by pushback, from BENCH_CONCURRENCY clients
# that ask again at once, each acting for its own end user (--forwarded-for, from the
# trusted 127.0.0.1) as in the suite's 1 s-deadline row. Over the measured window it
# reads the server's CPU time outside its hashing threads (/proc/PID/task/*/stat) and
# the refusals answered (/metrics), and prints the CPU time per refusal. With
# BENCH_BASELINE_AUTHD, every round runs that binary too, right before this tree's.
# Prints a Markdown table on stdout.
#
# With BENCH_PROFILE=1 it also samples the server's runtime threads over the window
# (perf's cpu-clock at 250 Hz, with DWARF call stacks) and prints a second table that
# splits their CPU time per refusal by the code on the stack: the HTTP/2 connection
# (h2 reading and writing frames, the socket calls: hyper's connection task), the
# refused streams (each stream's task: authd's layers, the answer's encoding, hyper
# sending it), and the rest (admitted requests, timers, idle wake-ups). Run it with
# CARGO_PROFILE_RELEASE_DEBUG=line-tables-only (and a CARGO_TARGET_DIR of its own:
# that setting rebuilds everything), so that the stacks name inlined frames too.
#
# Usage: bench/refusal-cost.sh
# Environment: BENCH_DURATION [10], BENCH_WARMUP [5], BENCH_ROUNDS [3],
#   BENCH_CONCURRENCY [400], BENCH_DEADLINE (authbench --timeout) [100ms],
#   BENCH_BASELINE_AUTHD (an authd binary of another revision) [unset],
#   BENCH_PROFILE (1: the second table) [unset].
# Needs: cargo, taskset, python3, curl; perf (Debian's linux-perf) for BENCH_PROFILE.
set -euo pipefail

DURATION=${BENCH_DURATION:-10}
WARMUP=${BENCH_WARMUP:-5}
ROUNDS=${BENCH_ROUNDS:-3}
CONCURRENCY=${BENCH_CONCURRENCY:-400}
DEADLINE=${BENCH_DEADLINE:-100ms}
# authd's default cost: one batch of hashing takes longer than the deadline.
ITERATIONS=600000

cd "$(dirname "$0")/.."
if [[ -n ${BENCH_PROFILE:-} ]] && ! command -v perf >/dev/null; then
    echo "BENCH_PROFILE needs perf (Debian's linux-perf)" >&2
    exit 1
fi
# shellcheck source=bench/lib.sh
source bench/lib.sh

# cpu_ticks: the running server's CPU time outside its hashing threads, in clock ticks.
cpu_ticks() {
    local task total=0
    for task in "/proc/$SERVER"/task/*; do
        [[ $(<"$task/comm") == authd-hash-* ]] && continue
        # utime and stime: fields 14 and 15 (the name, field 2, has no spaces here).
        total=$((total + $(awk '{ print $14 + $15 }' "$task/stat")))
    done
    echo "$total"
}

# refused: RESOURCE_EXHAUSTED answers of the running server so far.
refused() {
    curl -fsS "http://127.0.0.1:$METRICS_PORT/metrics" |
        awk '/^authd_grpc_requests_total\{code="RESOURCE_EXHAUSTED"/ { n += $2 } END { print n + 0 }'
}

# measure BINARY NAME LABEL: one row of the table (and, profiling, of the second).
measure() {
    METRICS_PORT=$(free_port)
    # authd's default log level, not start_pinned's: a refusal's line, when it has
    # one, is part of what it costs.
    start_pinned "$1" "sqlite://$WORK/$2.db" AUTHD_TRUSTED_CALLERS=127.0.0.1 \
        AUTHD_METRICS_LISTEN="127.0.0.1:$METRICS_PORT" AUTHD_LOG=info
    taskset -c 1 "$AUTHBENCH" login --target "http://127.0.0.1:$PORT" --users 64 \
        --concurrency "$CONCURRENCY" --timeout "$DEADLINE" --forwarded-for 131072 \
        --duration "${DURATION}s" --warmup "${WARMUP}s" --json >"$WORK/$2.json" &
    local client=$!
    # authbench registers its users before its warm-up: wait for its first refusal.
    until (($(refused) > 0)); do sleep 0.1; done
    sleep "$WARMUP"
    local ticks0 refused0 ticks1 refused1
    ticks0=$(cpu_ticks) refused0=$(refused)
    if [[ -n ${BENCH_PROFILE:-} ]]; then
        perf record -q -e cpu-clock -F "$PROFILE_HZ" --call-graph dwarf,32768 -p "$SERVER" \
            -o "$WORK/$2.perf" -- sleep "$DURATION" 2>/dev/null
    else
        sleep "$DURATION"
    fi
    ticks1=$(cpu_ticks) refused1=$(refused)
    wait "$client"
    stop
    python3 - "$WORK/$2.json" "$((ticks1 - ticks0))" "$((refused1 - refused0))" \
        "$(getconf CLK_TCK)" "$DURATION" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
ticks, refused, hz, seconds = (int(a) for a in sys.argv[2:])
micros = ticks / hz * 1e6 / max(refused, 1)
timeouts = report["client_errors"]["timeout"] + report["client_errors"]["connection"]
print(f"{refused / seconds:,.0f} | {micros:.1f} | {report['ok']} | {timeouts} |")
EOF
    if [[ -n ${BENCH_PROFILE:-} ]]; then
        echo "| $3 | $(profile_row "$WORK/$2.perf" "$((refused1 - refused0))")" >>"$WORK/profile.md"
    fi
}

# profile_row PERF_DATA REFUSED: one row of the second table, the runtime threads' samples
# in PERF_DATA per refusal, by the code on their stacks.
profile_row() {
    perf script -i "$1" --comm tokio-rt-worker -F tid,ip,sym 2>/dev/null |
        python3 -c '
import sys
hz, refused = int(sys.argv[1]), max(int(sys.argv[2]), 1)
counts = {"connection": 0, "refused": 0, "rest": 0}
def add(frames):
    stack = " ".join(frames)
    if "H2Stream" in stack:
        # A stream whose request reached a handler was admitted.
        admitted = "authd::handlers::" in stack or "auth_service_server" in stack
        counts["rest" if admitted else "refused"] += 1
    elif "authd::transport::connection::serve" in stack:
        counts["connection"] += 1
    elif frames:
        counts["rest"] += 1
frames = []
for line in sys.stdin:
    if line[:1] not in (" ", "\t"):
        add(frames)
        frames = []
    elif line.strip():
        frames.append(line.strip())
add(frames)
micros = {k: v / hz * 1e6 / refused for k, v in counts.items()}
total = sum(micros.values())
print(" | ".join(f"{micros[k]:.1f}" for k in ("connection", "refused", "rest")), f"| {total:.1f} |")
' "$PROFILE_HZ" "$2"
}
PROFILE_HZ=250

echo "| binary | round | refusals/s | server CPU µs per refusal | logins OK | client timeouts |"
echo "|---|---|---:|---:|---:|---:|"
for round in $(seq "$ROUNDS"); do
    if [[ -n ${BENCH_BASELINE_AUTHD:-} ]]; then
        echo "| baseline | $round | $(measure "$BENCH_BASELINE_AUTHD" "baseline-$round" baseline)"
    fi
    echo "| this tree | $round | $(measure "$AUTHD" "tree-$round" "this tree")"
done
if [[ -n ${BENCH_PROFILE:-} ]]; then
    echo
    echo "Runtime threads' CPU µs per refusal, by the code on the stack (perf, $PROFILE_HZ Hz):"
    echo
    echo "| binary | HTTP/2 connection | refused streams | the rest | in all |"
    echo "|---|---:|---:|---:|---:|"
    cat "$WORK/profile.md"
fi
