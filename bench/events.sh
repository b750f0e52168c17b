#!/usr/bin/env bash
# bench/events.sh: what account events cost and how fast they leave (docs/events.md),
# authd pinned to CPU 0 with one hash thread and its other settings the defaults,
# its clients (authbench, the import CLI, the webhook receiver) on CPU 1:
#
# - registrations per second (authbench register, BENCH_CONCURRENCY in flight, PBKDF2
#   at BENCH_ITERATIONS), each run on a fresh SQLite file, of a baseline authd from
#   before the events outbox (BENCH_BASELINE_AUTHD, e.g. built in a `git worktree` of
#   744144c^1, the first parent of the merge that brought account events) and of this
#   tree's, which writes each registration's event in the registration's transaction:
#   in turns, the baseline first, BENCH_ROUNDS times; their medians and the ratio;
# - events per second streamed to one subscriber: BENCH_EVENTS users imported into a
#   fresh database (`authd admin users import`, a user.registered event each, no
#   hashing), then `authbench events -n BENCH_EVENTS` (WatchEvents on the admin port
#   from the first event), BENCH_ROUNDS times; the median;
# - webhook deliveries per second to one loopback endpoint (a Python
#   ThreadingHTTPServer on CPU 1 that answers 204 at once): the endpoint configured
#   before the import, so the whole backlog is its to deliver, once authd restarts
#   with AUTHD_WEBHOOKS; counted by the receiver over BENCH_DURATION seconds after
#   BENCH_WARMUP, with the CPU authd and the receiver used meanwhile.
#
# Usage: BENCH_BASELINE_AUTHD=/path/to/baseline/authd bench/events.sh
# Environment: BENCH_BASELINE_AUTHD [unset: no baseline rows], BENCH_ITERATIONS
#   [10000], BENCH_CONCURRENCY [300], BENCH_DURATION [10], BENCH_WARMUP [3],
#   BENCH_ROUNDS [2], BENCH_EVENTS [1000000].
# Prints a Markdown table on stdout. The admin key is the run's own (its SHA-256 in
# the keys file, the key itself only in the clients' environment), and so is the
# webhook signing secret (only in authd's environment): neither is on a command line.
set -euo pipefail

BASELINE=${BENCH_BASELINE_AUTHD:-}
ITERATIONS=${BENCH_ITERATIONS:-10000}
CONCURRENCY=${BENCH_CONCURRENCY:-300}
DURATION=${BENCH_DURATION:-10}
WARMUP=${BENCH_WARMUP:-3}
ROUNDS=${BENCH_ROUNDS:-2}
EVENTS=${BENCH_EVENTS:-1000000}

cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
source bench/lib.sh

if [[ -n $BASELINE && ! -x $BASELINE ]]; then
    echo "events.sh: BENCH_BASELINE_AUTHD=$BASELINE is not an executable" >&2
    exit 1
fi

# The admin key (role admin: the import needs it; WatchEvents needs read).
ADMIN_KEY=$(head -c 32 /dev/urandom | base64 -w0)
(umask 077 && printf 'bench admin %s\n' \
    "$(printf '%s' "$ADMIN_KEY" | sha256sum | cut -d' ' -f1)" >"$WORK/admin-keys")
AUTHBENCH_ADMIN_KEY=$ADMIN_KEY
export AUTHBENCH_ADMIN_KEY

# 1. Registrations: the baseline and this tree in turns, a fresh database each.
baseline_runs=()
this_runs=()
for round in $(seq "$ROUNDS"); do
    if [[ -n $BASELINE ]]; then
        start_pinned "$BASELINE" "sqlite://$WORK/base-$round.db"
        baseline_runs+=("$(bench register)")
        stop
    fi
    start_pinned "$AUTHD" "sqlite://$WORK/this-$round.db"
    this_runs+=("$(bench register)")
    stop
done

# 2. The backlog, and its stream. The webhook endpoint is configured first (authd
# records where a new endpoint starts: after the events committed then, here none),
# with nothing listening yet and no event to send; the import follows without it.
AUTHD_WEBHOOK_SECRET="whsec_$(head -c 32 /dev/urandom | base64 -w0)"
export AUTHD_WEBHOOK_SECRET
HOOK_PORT=$(free_port)
HOOK="http://127.0.0.1:$HOOK_PORT/hook"
ADMIN_PORT=$(free_port)
DATABASE="sqlite://$WORK/events.db"
with_admin=(AUTHD_ADMIN_LISTEN="127.0.0.1:$ADMIN_PORT" AUTHD_ADMIN_KEYS_FILE="$WORK/admin-keys")
start_pinned "$AUTHD" "$DATABASE" "${with_admin[@]}" AUTHD_WEBHOOKS="$HOOK"
stop

python3 - "$WORK/users.jsonl" "$EVENTS" <<'PY'
import json, sys
path, count = sys.argv[1], int(sys.argv[2])
with open("tests/fixtures/foreign-hashes/foreign-hashes.jsonl") as f:
    phc = json.loads(f.readline())["hash"]
with open(path, "w") as out:
    for i in range(count):
        out.write(json.dumps({"username": f"event{i:07d}", "password_hash": phc},
                             separators=(",", ":")) + "\n")
PY
start_pinned "$AUTHD" "$DATABASE" "${with_admin[@]}"
AUTHD_ADMIN_KEY=$ADMIN_KEY taskset -c 1 "$AUTHD" admin --addr "127.0.0.1:$ADMIN_PORT" \
    users import "$WORK/users.jsonl" --on-conflict skip >/dev/null 2>"$WORK/import.log" || {
    cat "$WORK/import.log" >&2
    exit 1
}
stream_runs=()
for _ in $(seq "$ROUNDS"); do
    stream_runs+=("$(taskset -c 1 "$AUTHBENCH" events --target "http://127.0.0.1:$PORT" \
        --admin "http://127.0.0.1:$ADMIN_PORT" -n "$EVENTS" --json |
        python3 -c 'import json, sys; r = json.load(sys.stdin)
assert r["ok"] == r["requests"], r
print(round(r["ok_qps"]))')")
done
stop

# 3. The backlog delivered to one endpoint: a receiver that counts and answers 204
# (GET answers its count, its clock and the CPU it has used).
taskset -c 1 python3 - "$HOOK_PORT" <<'PY' &
import http.server, sys, threading, time

count = 0
lock = threading.Lock()

class Hook(http.server.BaseHTTPRequestHandler):
    # Keep-alive: authd keeps its connection to the endpoint between deliveries.
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        global count
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(204)
        self.end_headers()
        if "webhook-signature" in self.headers:
            with lock:
                count += 1

    def do_GET(self):
        with lock:
            body = f"{count} {time.monotonic()} {time.process_time()}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Hook).serve_forever()
PY
STARTED+=($!)
# count: the receiver's "DELIVERED SECONDS CPU_SECONDS", waited for until it answers.
count() {
    python3 - "$HOOK_PORT" <<'PY'
import sys, time, urllib.request
for _ in range(100):
    try:
        print(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/count").read().decode().strip())
        break
    except OSError:
        time.sleep(0.1)
else:
    sys.exit("the webhook receiver did not answer")
PY
}
# cpu_seconds PID: the CPU time the process has used (user and system).
cpu_seconds() {
    awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$1/stat"
}
count >/dev/null
start_pinned "$AUTHD" "$DATABASE" AUTHD_WEBHOOKS="$HOOK"
sleep "$WARMUP"
read -r delivered_0 at_0 hook_cpu_0 < <(count)
authd_cpu_0=$(cpu_seconds "$SERVER")
sleep "$DURATION"
read -r delivered_1 at_1 hook_cpu_1 < <(count)
authd_cpu_1=$(cpu_seconds "$SERVER")
stop
if ((delivered_1 < EVENTS)); then
    left="yes ($((EVENTS - delivered_1)) of $EVENTS)"
else
    left="no: raise BENCH_EVENTS"
fi

python3 - "$ITERATIONS" "$CONCURRENCY" "$EVENTS" "$left" \
    "${baseline_runs[*]}" "${this_runs[*]}" "${stream_runs[*]}" \
    "$delivered_0 $at_0 $hook_cpu_0 $authd_cpu_0" "$delivered_1 $at_1 $hook_cpu_1 $authd_cpu_1" <<'PY'
import statistics, sys
iterations, concurrency, events, left = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
baseline, this, stream = ([float(x) for x in arg.split()] for arg in sys.argv[5:8])
(n0, t0, hook0, authd0), (n1, t1, hook1, authd1) = (map(float, a.split()) for a in sys.argv[8:10])

def runs(xs):
    return ", ".join(f"{x:.0f}" for x in xs)

print("| measure | value |")
print("|---|---:|")
what = f"registrations per second, PBKDF2 {iterations:,}, {concurrency} in flight"
if baseline:
    print(f"| {what}: baseline, no events (median of {runs(baseline)}) "
          f"| {statistics.median(baseline):.0f} |")
print(f"| {what}: this tree, an event in each registration's transaction "
      f"(median of {runs(this)}) | {statistics.median(this):.0f} |")
if baseline:
    ratio = statistics.median(this) / statistics.median(baseline)
    print(f"| this tree ÷ baseline (target ≥ 0.95) | {ratio:.2f} |")
print(f"| events per second streamed to one subscriber, a backlog of {events:,} "
      f"(median of {runs(stream)}) | {statistics.median(stream):.0f} |")
span = t1 - t0
print(f"| webhook deliveries per second to one loopback endpoint | {(n1 - n0) / span:.0f} |")
print(f"| authd's CPU meanwhile (share of CPU 0) | {100 * (authd1 - authd0) / span:.0f} % |")
print(f"| the receiver's CPU meanwhile (share of CPU 1) | {100 * (hook1 - hook0) / span:.0f} % |")
print(f"| backlog left when the deliveries' measurement ended | {left} |")
PY
