#!/usr/bin/env bash
# bench/sizing.sh: the figures of docs/sizing.md, measured on this machine in one
# run, and the page written from them.
#
#   bench/sizing.sh [--out docs/sizing.md]   # BENCH_DURATION=10 BENCH_WARMUP=3
#
# Every server is a release authd pinned to CPU 0 with one hash thread (bench/lib.sh),
# authbench pinned to CPU 1, a fresh SQLite file each. It measures:
# - hashes per second per core at 100k, 310k and 600k rounds for each PBKDF2 engine
#   this CPU runs (`authd hash-bench`, full batches);
# - logins per second per core through the server at the same costs (auto engine);
# - what a Login costs beside its hash: logins per second at 1,000 rounds against the
#   hashes per second `authd hash-bench` makes at 1,000 rounds, in the same run; and
#   the server's CPU time per request (its threads' run time from /proc, over the
#   steady part of a run) for a health check, ValidateToken, Refresh and Login, the
#   hash thread's share apart;
# - ValidateToken per second per core with an HS256 and an EdDSA key;
# - store operations, database writes and Redis commands per Login, Refresh and
#   ValidateToken (the login throttle and a rate limit on each RPC through a Redis
#   of its own, whose MONITOR lists what the server sends), as the difference between
#   a run of 600 requests and one of 100, so each run's set-up (registering its
#   users, its first logins) cancels out;
# - memory: the server's peak RSS idle, with 1,000 connections, and with 2,000
#   logins waiting for their hash against 100.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=docs/sizing.md
[[ ${1:-} == --out ]] && OUT=$2
DURATION=${BENCH_DURATION:-10}
WARMUP=${BENCH_WARMUP:-3}
# shellcheck source=bench/lib.sh
source bench/lib.sh

CPU=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
REV=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
ROUNDS=(100000 310000 600000)

# The lines of the server's /metrics whose names match the regular expression $1.
metrics() {
    curl -s "http://127.0.0.1:$METRICS_PORT/metrics" | grep -E "$1" | grep -v '^#' || true
}

echo "== hashing, per core" >&2
declare -A HASH
ENGINES=()
for engine in avx512 sha-ni avx2 portable; do
    if ! AUTHD_HASH_BACKEND=$engine "$AUTHD" hash-bench --iterations 1000 --threads 1 \
        --duration 100ms >/dev/null 2>&1; then
        continue
    fi
    ENGINES+=("$engine")
    for rounds in "${ROUNDS[@]}"; do
        HASH[$engine,$rounds]=$(AUTHD_HASH_BACKEND=$engine taskset -c 0 "$AUTHD" hash-bench \
            --iterations "$rounds" --threads 1 --duration 5s |
            awk '/^total:/ { printf "%.1f", $2 }')
    done
done
AUTO=$("$AUTHD" hash-bench --iterations 1000 --threads 1 --duration 100ms |
    sed -n 's/.* engine \([a-z0-9-]*\) .*/\1/p' | head -n 1)

echo "== logins, per core" >&2
declare -A LOGINS
CONCURRENCY=100
for rounds in "${ROUNDS[@]}"; do
    ITERATIONS=$rounds
    start_pinned "$AUTHD" "sqlite://$WORK/login-$rounds.db"
    LOGINS[$rounds]=$(bench login)
    stop
done

echo "== a Login beside its hash, at 1,000 rounds" >&2
ITERATIONS=1000
HASH_1K=$(taskset -c 0 "$AUTHD" hash-bench --iterations 1000 --threads 1 --duration 5s |
    awk '/^total:/ { printf "%.1f", $2 }')
start_pinned "$AUTHD" "sqlite://$WORK/login-1000.db"
LOGIN_1K=$(bench login)
stop

# run_ns: nanoseconds the server's threads have run, all of them and its hash threads.
run_ns() {
    local task all=0 hash=0 ns
    for task in /proc/"$SERVER"/task/*; do
        ns=$(cut -d' ' -f1 "$task/schedstat" 2>/dev/null || echo 0)
        all=$((all + ns))
        [[ $(cat "$task/comm" 2>/dev/null) == authd-hash* ]] && hash=$((hash + ns))
    done
    echo "$all $hash"
}

# cpu_per SCENARIO: "µs µs_hashing" of server CPU time per successful request, over
# the middle of a run (a second in from the warm-up to a second before the end).
cpu_per() {
    local t0 h0 t1 h1 s0 s1 qps
    start_pinned "$AUTHD" "sqlite://$WORK/cpu-$1.db"
    taskset -c 1 "$AUTHBENCH" "$1" --target "http://127.0.0.1:$PORT" --concurrency 100 \
        --duration "${DURATION}s" --warmup "${WARMUP}s" --json >"$WORK/cpu.json" &
    local client=$!
    sleep $((WARMUP + 1))
    read -r t0 h0 < <(run_ns)
    s0=$(date +%s.%N)
    sleep $((DURATION - 2))
    read -r t1 h1 < <(run_ns)
    s1=$(date +%s.%N)
    wait "$client"
    stop
    qps=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ok_qps"])' "$WORK/cpu.json")
    python3 -c 'import sys; t0, h0, t1, h1, s0, s1, q = map(float, sys.argv[1:]); n = q * (s1 - s0); print(f"{(t1 - t0) / 1e3 / n:.1f} {(h1 - h0) / 1e3 / n:.1f}")' \
        "$t0" "$h0" "$t1" "$h1" "$s0" "$s1" "$qps"
}
declare -A SERVER_CPU
for scenario in health validate refresh login; do
    SERVER_CPU[$scenario]=$(cpu_per "$scenario")
done

echo "== ValidateToken, per core" >&2
declare -A VALIDATE
ITERATIONS=1000
CONCURRENCY=64
EDDSA=$("$AUTHD" keygen --alg ed25519 --kid ed)
for ring in HS256 EdDSA; do
    keys=$KEY
    [[ $ring == EdDSA ]] && keys=$EDDSA
    start_pinned "$AUTHD" "sqlite://$WORK/validate-$ring.db" AUTHD_TOKEN_KEYS="$keys"
    VALIDATE[$ring]=$(bench validate)
    stop
done

echo "== store and Redis work per request" >&2
REDIS_PORT=$(free_port)
redis_server "$REDIS_PORT"
LIMITS="Login:peer=1000000/1s,Refresh:peer=1000000/1s,ValidateToken:peer=1000000/1s"

# counts SCENARIO REQUESTS: the store operations, database writes and Redis commands
# of a fresh server answering REQUESTS of SCENARIO (with its set-up), one per line.
counts() {
    METRICS_PORT=$(free_port)
    redis-cli -p "$REDIS_PORT" flushall >/dev/null
    redis-cli -p "$REDIS_PORT" monitor >"$WORK/monitor" &
    MONITOR=$!
    start_pinned "$AUTHD" "sqlite://$WORK/counts-$1-$2.db" \
        AUTHD_METRICS_LISTEN="127.0.0.1:$METRICS_PORT" AUTHD_REDIS_URL="redis://127.0.0.1:$REDIS_PORT" \
        AUTHD_RATE_LIMITS="$LIMITS"
    taskset -c 1 "$AUTHBENCH" "$1" --target "http://127.0.0.1:$PORT" --concurrency 10 \
        --users 10 --requests "$2" --json >/dev/null
    metrics '^authd_store_operation_duration_seconds_count' |
        sed -n 's/.*operation="\([a-z_]*\)".* \([0-9.e+]*\)$/store \1 \2/p'
    metrics '^authd_sqlite_batch_size_sum' | awk '{ print "writes all", $2 }'
    stop
    kill "$MONITOR" 2>/dev/null || true
    wait "$MONITOR" 2>/dev/null || true
    # The commands the server sent (a script's own commands show as [N lua]), by name.
    sed -n 's/^[0-9.]* \[[0-9]* 127\.[0-9.:]*\] "\([a-zA-Z]*\)".*/\1/p' "$WORK/monitor" |
        tr '[:upper:]' '[:lower:]' | sort | uniq -c | awk '{ print "redis", $2, $1 }'
}

declare -A PER
for scenario in login refresh validate; do
    counts "$scenario" 100 >"$WORK/few"
    counts "$scenario" 600 >"$WORK/many"
    PER[$scenario]=$(python3 - "$WORK/few" "$WORK/many" <<'EOF'
import sys
def load(path):
    out = {}
    for line in open(path):
        kind, name, value = line.split()
        out[(kind, name)] = out.get((kind, name), 0) + float(value)
    return out
few, many = load(sys.argv[1]), load(sys.argv[2])
per = {k: (many.get(k, 0) - few.get(k, 0)) / 500 for k in set(few) | set(many)}
def show(kind):
    items = sorted((n, v) for (k, n), v in per.items() if k == kind and round(v, 2) > 0)
    total = sum(v for _, v in items)
    detail = ", ".join(f"{n} {v:.2f}" for n, v in items)
    return f"{total:.2f}" + (f" ({detail})" if detail else "")
print(f"{show('store')} | {per.get(('writes', 'all'), 0):.2f} | {show('redis')}")
EOF
)
done

echo "== memory" >&2
ITERATIONS=100000
start_pinned "$AUTHD" "sqlite://$WORK/memory-idle.db"
IDLE_RSS=$(peak_rss_mb)
taskset -c 1 "$AUTHBENCH" health --target "http://127.0.0.1:$PORT" --connections 1000 \
    --concurrency 1000 --requests 20000 --json >/dev/null
CONN_RSS=$(peak_rss_mb)
stop
# in_flight N: peak RSS with N logins in flight on 10 connections: deadlines long
# enough to admit them all, so each answered login is replaced by one more waiting
# for its hash (about 350 are answered a second at 100k rounds).
in_flight() {
    start_pinned "$AUTHD" "sqlite://$WORK/memory-$1.db"
    taskset -c 1 "$AUTHBENCH" login --target "http://127.0.0.1:$PORT" --connections 10 \
        --users 10 --concurrency "$1" --duration 4s --timeout 60s --json >/dev/null || true
    peak_rss_mb
    stop
}
FEW_RSS=$(in_flight 100)
MANY_RSS=$(in_flight 2000)

echo "== writing $OUT" >&2
python3 - "$OUT" <<EOF
import sys
cpu, rev, auto = """$CPU""", "$REV", "$AUTO"
rounds = [int(r) for r in "${ROUNDS[*]}".split()]
engines = "${ENGINES[*]}".split()
hashes = {}
for entry in """$(for k in "${!HASH[@]}"; do echo "$k=${HASH[$k]}"; done)""".split():
    key, value = entry.split("=")
    engine, r = key.split(",")
    hashes[(engine, int(r))] = float(value)
logins = {int(k): int(v) for k, v in (e.split("=") for e in """$(for k in "${!LOGINS[@]}"; do echo "$k=${LOGINS[$k]}"; done)""".split())}
validate = {"HS256": int("${VALIDATE[HS256]}"), "EdDSA": int("${VALIDATE[EdDSA]}")}
hash_1k, login_1k = float("$HASH_1K"), int("$LOGIN_1K")
per_request = {"health check": "${SERVER_CPU[health]}", "ValidateToken": "${SERVER_CPU[validate]}",
               "Refresh": "${SERVER_CPU[refresh]}", "Login": "${SERVER_CPU[login]}"}
per_request = {k: tuple(map(float, v.split())) for k, v in per_request.items()}
per = {"Login": """${PER[login]}""", "Refresh": """${PER[refresh]}""", "ValidateToken": """${PER[validate]}"""}
idle, conn, few, many = $IDLE_RSS, $CONN_RSS, $FEW_RSS, $MANY_RSS

out = []
w = out.append
w("# Sizing authd")
w("")
w("<!-- Written by bench/sizing.sh; rerun it rather than editing the figures. -->")
w("")
w(f"Measured by \`bench/sizing.sh\` in one run on **{cpu}** ({len(open('/proc/cpuinfo').read().split('processor')) - 1} cores), "
  f"authd {rev}: the server pinned to one core with one hash thread, the load generator "
  "on another, a fresh SQLite file per server. Figures are per core; a machine of another "
  "kind gives other figures, so rerun the script on the hardware you size for.")
w("")
w("## Password hashing: logins per second per core")
w("")
w("A Login or a Register costs one PBKDF2-SHA256 hash of \`AUTHD_PBKDF2_ITERATIONS\` rounds, "
  "and the hash is nearly all of its cost at the rounds worth using. "
  "\`authd hash-bench\` measures the hashing alone (full batches, as under load); the last "
  "rows are whole Logins through the server (engine \`" + auto + "\`, 100 in flight).")
w("")
w("| engine | " + " | ".join(f"{r // 1000}k rounds" for r in rounds) + " |")
w("|---|" + "---:|" * len(rounds))
for e in engines:
    w(f"| {e} (hashes/s) | " + " | ".join(f"{hashes[(e, r)]:,.0f}" for r in rounds) + " |")
w("| **Logins/s through the server** | " + " | ".join(f"**{logins[r]:,}**" for r in rounds) + " |")
w("| Logins ÷ hashes of " + auto + " | " + " | ".join(f"{logins[r] / hashes[(auto, r)]:.2f}" for r in rounds) + " |")
w("")
w("### Cores for N logins a second")
w("")
w("Hashing runs on \`AUTHD_HASH_THREADS\` threads (one per core by default), so a login "
  "rate needs about N ÷ (logins/s per core) cores, plus headroom: a burst beyond the "
  "hashing capacity is refused with RESOURCE_EXHAUSTED and a retry hint, not queued "
  "(docs/operations.md, Overload). From the measured rate above:")
w("")
w("| logins/s | " + " | ".join(f"{r // 1000}k rounds" for r in rounds) + " |")
w("|---:|" + "---:|" * len(rounds))
for n in (100, 1000, 10000):
    w(f"| {n:,} | " + " | ".join(f"{n / logins[r]:.1f} cores" for r in rounds) + " |")
w("")
w("Registrations cost the same hash; count them with the logins. Refresh and "
  "ValidateToken do not hash.")
w("")
w("### A Login beside its hash")
w("")
w("At 1,000 rounds the hash is small and the rest of a Login shows: reading the user, "
  "storing the session (SQLite: a durable commit shared by the logins of a batch), "
  "signing the token, the throttle, logs and metrics, and gRPC itself.")
w("")
w("| at 1,000 rounds | per second | µs each |")
w("|---|---:|---:|")
w(f"| hashes (\`authd hash-bench\`, {auto}) | {hash_1k:,.0f} | {1e6 / hash_1k:.1f} |")
w(f"| Logins through the server | {login_1k:,} | {1e6 / login_1k:.1f} |")
w(f"| **a Login beside its hash** | | **{1e6 / login_1k - 1e6 / hash_1k:.1f}** |")
w("")
w("Where that goes: the server's CPU time per request (the run time of its threads, "
  "read from /proc over the steady part of a run at 100 in flight, 1,000 rounds). A "
  "health check and ValidateToken are gRPC and authd's middleware alone; Refresh adds "
  "one durable write (no hash); Login adds a read of the user and its hash.")
w("")
w("| request | server CPU (µs) | of which the hash thread |")
w("|---|---:|---:|")
for name, (total, hashing) in per_request.items():
    w(f"| {name} | {total:.1f} | {hashing:.1f} |")
w("")
w("## Tokens: ValidateToken per second per core")
w("")
w("| access token key | ValidateToken/s |")
w("|---|---:|")
for ring, qps in validate.items():
    w(f"| {ring} | {qps:,} |")
w("")
w("ValidateToken reads no database, and calls Redis only for a rate limit rule that "
  "matches it (the table below): it scales with cores. Services that verify tokens "
  "themselves from the JWKS cost authd nothing.")
w("")
w("## Database and Redis work per request")
w("")
w("Per request, with the login throttle and one rate limit on each RPC in Redis "
  "(\`AUTHD_REDIS_URL\`, \`AUTHD_RATE_LIMITS\`=\`Login:peer=…,Refresh:peer=…,ValidateToken:peer=…\`); "
  "the difference between 600 requests and 100, so set-up cancels out. Store operations "
  "include reads; database writes are rows written by SQLite's writer (PostgreSQL runs the "
  "same statements). Redis commands are those authd sends (a script is one \`EVALSHA\`); "
  "each rate limit rule that matches a request adds one.")
w("")
w("| RPC | store operations | database writes | Redis commands |")
w("|---|---|---:|---|")
for rpc, row in per.items():
    w(f"| {rpc} | {row} |")
w("")
w("Without \`AUTHD_REDIS_URL\` the throttle and the limits are kept in process: no Redis "
  "command at all. A Redis round trip is spent on the request's path; size Redis for the "
  "sum of these rates over every replica.")
w("")
w("## Memory")
w("")
w("| state | peak RSS (MB) |")
w("|---|---:|")
w(f"| idle, after start | {idle} |")
w(f"| 1,000 connections, each with requests | {conn} |")
w(f"| 100 logins in flight (waiting for their hash), 10 connections | {few} |")
w(f"| 2,000 logins in flight, 10 connections | {many} |")
w("")
w(f"About **{(conn - idle) * 1024 / 1000:.0f} KB per connection** and "
  f"**{(many - few) * 1024 / 1900:.1f} KB per request in flight**. "
  "Requests in flight are bounded (\`AUTHD_MAX_IN_FLIGHT\`), and so is the memory "
  "they hold.")
w("")
w("## Choosing the rounds")
w("")
w("\`authd hash-bench --target 250ms\` measures one login alone on this machine and "
  "recommends the most rounds it affords within the target; the table above gives the "
  "throughput that choice leaves per core.")
open(sys.argv[1], "w").write("\n".join(out) + "\n")
EOF
echo "wrote $OUT" >&2
