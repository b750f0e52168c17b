#!/usr/bin/env bash
# bench/throttle.sh: what the login throttle's reservations cost. In one run, pinned
# as bench/seed-table.sh pins (the server on CPU 0 with one hash thread, authbench on
# CPU 1), Login QPS of a baseline authd (BENCH_BASELINE_AUTHD, e.g. built from an
# earlier commit in a `git worktree`) and of this tree's, alternating ROUNDS times,
# each on a fresh server and SQLite file: with the in-process counts, and with the
# counts in Redis when BENCH_REDIS_URL is set (a key prefix of its own per server,
# removed afterwards). On Redis it also reports, per login, the commands Redis ran
# (those a script runs included) and the scripts called (this tree's round trips:
# one script call each; a baseline that pipelines plain commands calls none).
# Prints a Markdown table on stdout.
#
# Usage: BENCH_BASELINE_AUTHD=/path/to/baseline/authd bench/throttle.sh
# Environment: BENCH_DURATION [15], BENCH_WARMUP [5], BENCH_ROUNDS [3],
#   BENCH_CONCURRENCY [50], BENCH_ITERATIONS (PBKDF2 cost) [10000],
#   BENCH_REDIS_URL [unset: no Redis rows], BENCH_BASELINE_AUTHD [unset: no
#   baseline rows].
# Needs: cargo, taskset, python3 (and redis-cli for Redis).
set -euo pipefail

DURATION=${BENCH_DURATION:-15}
WARMUP=${BENCH_WARMUP:-5}
ROUNDS=${BENCH_ROUNDS:-3}
CONCURRENCY=${BENCH_CONCURRENCY:-50}
ITERATIONS=${BENCH_ITERATIONS:-10000}
REDIS_URL=${BENCH_REDIS_URL:-}
BASELINE=${BENCH_BASELINE_AUTHD:-}

cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
source bench/lib.sh

# start BINARY DATABASE_URL [REDIS_URL PREFIX]: a fresh server, waited for until it
# answers.
start() {
    start_pinned "$1" "$2" ${3:+AUTHD_REDIS_URL="$3"} ${4:+AUTHD_RATE_LIMIT_PREFIX="$4"}
}

# login_run: "QPS LOGINS" of one closed-loop login run (LOGINS counts the warm-up's too).
login_run() {
    taskset -c 1 "$AUTHBENCH" login --target "http://127.0.0.1:$PORT" \
        --concurrency "$CONCURRENCY" --duration "${DURATION}s" --warmup "${WARMUP}s" --json \
        | python3 -c 'import json,sys; r=json.load(sys.stdin); print(round(r["ok_qps"]), r["warmup_requests"] + r["requests"])'
}

redis_commands() {
    redis-cli -u "$REDIS_URL" INFO stats | tr -d '\r' | sed -n 's/^total_commands_processed://p'
}

# Script calls so far (EVALSHA, and EVAL for a script not yet loaded).
redis_scripts() {
    redis-cli -u "$REDIS_URL" INFO commandstats | python3 -c '
import re, sys
print(sum(int(m) for m in re.findall(r"^cmdstat_eval(?:sha)?:calls=(\d+),", sys.stdin.read(), re.M)))'
}

row() { echo "| $1 | $2 | $3 | $4 | $5 |"; }

# measure NAME BINARY [REDIS]: one row.
measure() {
    local name=$1 binary=$2 redis=${3:-} prefix="" before=0 scripts=0 qps logins per="–" calls="–"
    local db="$WORK/${name// /-}-$round${redis:+-redis}.db"
    if [[ -n $redis ]]; then
        prefix="authd-bench-throttle-$RANDOM$RANDOM"
        start "$binary" "sqlite://$db" "$redis" "$prefix"
        before=$(redis_commands)
        scripts=$(redis_scripts)
    else
        start "$binary" "sqlite://$db"
    fi
    read -r qps logins < <(login_run)
    if [[ -n $redis ]]; then
        # Less the INFO calls themselves.
        per=$(python3 -c "print(f'{($(redis_commands) - $before - 1) / $logins:.2f}')")
        calls=$(python3 -c "print(f'{($(redis_scripts) - $scripts) / $logins:.2f}')")
        redis-cli -u "$REDIS_URL" --scan --pattern "$prefix:*" | xargs -r redis-cli -u "$REDIS_URL" DEL >/dev/null
    fi
    stop
    local where="in process"
    [[ -n $redis ]] && where="Redis"
    row "login, $where (round $round)" "$name" "$qps" "$per" "$calls"
}

echo "| scenario | authd | successful QPS | Redis commands per login | Redis script calls per login |"
echo "|---|---|---:|---:|---:|"
for round in $(seq "$ROUNDS"); do
    for redis in "" "$REDIS_URL"; do
        if [[ -n $BASELINE ]]; then
            measure baseline "$BASELINE" "$redis"
        fi
        measure "this tree" "$AUTHD" "$redis"
        [[ -z $REDIS_URL ]] && break
    done
done
