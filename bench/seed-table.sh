#!/usr/bin/env bash
# bench/seed-table.sh: the benchmark suite. Reproduces the original load test's table
# against authd on this machine and writes it, with a description of the machine and
# the command, to bench/RESULTS.md (or --out FILE).
#
# For each scenario it starts a fresh release authd on a fresh SQLite file in a temp
# dir, pinned with taskset to half of the cores (on a 2-core machine: the server on
# core 0 with one hash thread, authbench on core 1), waits until it is SERVING, runs
# authbench --json with a warm-up, reads the server's peak RSS (VmHWM) and stops it.
# A fresh server per scenario gives each row its own peak RSS and an empty database.
# Throughout every scenario a prober checks the health-only port 20 times a second,
# as Kubernetes probes do; its p99 is the table's "probe p99" column.
# Before that it measures the hash-bound limit (`authd hash-bench`) at each PBKDF2
# cost on the server's cores: no login or registration can go faster than it.
# In the same run, on the same cores, it measures the report's service
# (bench/report-service: the FastAPI + SQLite service authd replaces, one uvicorn
# worker, fresh per row on a fresh SQLite file) with authbench --protocol http:
# login at 100 and 2,000 in flight, register at 100 and 5,000, PBKDF2 10k; a closing
# table sets authd's accepted requests per second under overload against its own.
#
# Usage: bench/seed-table.sh [--out FILE] [--quick]
#   --out FILE   where to write the results (default bench/RESULTS.md)
#   --quick      1 s warm-up and 2 s per scenario: checks the script, not authd
# Environment (defaults in brackets):
#   BENCH_DURATION    measured seconds per scenario [15]
#   BENCH_WARMUP      warm-up seconds per scenario [5]
#   BENCH_OVERLOAD_RUNS  how many times the overload rows run, each right after the
#                     uncongested row it is set against (login at 100, register at
#                     300, the polite client alone); the summary gives the median of
#                     the runs' ratios and their range [3]
#   BENCH_PORT        the server's port on 127.0.0.1 [a free one]
#   BENCH_HEALTH_PORT the server's health-only port (AUTHD_HEALTH_LISTEN), which the
#                     "health under register load" row and the prober of every row
#                     probe, as Kubernetes does [a free one]
#   BENCH_POSTGRES_URL  also run the login and register rows against PostgreSQL at
#                     this URL, each on a fresh schema that is dropped afterwards
#                     (needs psql) [unset: SQLite only]
#   BENCH_BASELINE_AUTHD  an authd binary of another revision (e.g. built from a
#                     `git worktree` of it): every row of authd is run with it too,
#                     in the same run, marked "baseline", against its own hash-bound
#                     limit and with its own defaults [unset: no baseline rows]
#   BENCH_REPORT_SERVICE  "off" leaves out the report's service's rows [on]. When on,
#                     a Python virtualenv with bench/report-service/requirements.txt
#                     is made once (python3 -m venv, pip from PyPI) and reused, in
#                     ${XDG_CACHE_HOME:-~/.cache}/authd-bench/report-service-venv-HASH
#                     (HASH: of the requirements file); if that fails, the rows are
#                     skipped and the script says why. Its 5,000 connections need as
#                     many open files: the soft limit (ulimit -n) is raised to the hard
#                     one, which must allow at least 6,000
# Needs: cargo, taskset (util-linux), python3 (3.11 or newer, with venv, for the
# report's service). The whole suite takes about 18 minutes after the build (30 with
# a baseline), two thirds of it the overload rows' runs.
set -euo pipefail

die() {
    echo "seed-table.sh: error: $*" >&2
    exit 1
}

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
}

COMMAND="bench/seed-table.sh${*:+ $*}"
OUT=bench/RESULTS.md
QUICK=0
while (($#)); do
    case $1 in
        --out) (($# >= 2)) || die "--out needs a file name"; OUT=$2; shift 2 ;;
        --out=*) OUT=${1#--out=}; shift ;;
        --quick) QUICK=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done

if ((QUICK)); then
    DURATION=${BENCH_DURATION:-2}
    WARMUP=${BENCH_WARMUP:-1}
else
    DURATION=${BENCH_DURATION:-15}
    WARMUP=${BENCH_WARMUP:-5}
fi
OVERLOAD_RUNS=${BENCH_OVERLOAD_RUNS:-3}
REPORT_SERVICE=${BENCH_REPORT_SERVICE:-on}
[[ $DURATION =~ ^[0-9]+$ && $DURATION -ge 1 ]] || die "BENCH_DURATION must be whole seconds ≥ 1"
[[ $WARMUP =~ ^[0-9]+$ ]] || die "BENCH_WARMUP must be whole seconds"
[[ $OVERLOAD_RUNS =~ ^[1-9][0-9]*$ ]] || die "BENCH_OVERLOAD_RUNS must be a number ≥ 1"
[[ $REPORT_SERVICE == on || $REPORT_SERVICE == off ]] ||
    die "BENCH_REPORT_SERVICE must be 'on' or 'off'"
for tool in cargo taskset python3; do
    command -v "$tool" >/dev/null || die "$tool is required"
done

cd "$(dirname "$0")/.."
ROOT=$PWD
case $OUT in /*) ;; *) OUT=$ROOT/$OUT ;; esac

# Half the cores for the server, the rest for authbench.
NPROC=$(nproc)
cpu_range() { if (($1 == $2)); then echo "$1"; else echo "$1-$2"; fi; }
if ((NPROC >= 2)); then
    HALF=$((NPROC / 2))
    SERVER_CPUS=$(cpu_range 0 $((HALF - 1)))
    CLIENT_CPUS=$(cpu_range "$HALF" $((NPROC - 1)))
    HASH_THREADS=$HALF
    CLIENT_THREADS=$((NPROC - HALF))
else
    echo "seed-table.sh: warning: one core: server and authbench share it" >&2
    SERVER_CPUS=0 CLIENT_CPUS=0 HASH_THREADS=1 CLIENT_THREADS=1
fi

echo "== building release binaries" >&2
cargo build --release --locked --bins >&2
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
AUTHD=$TARGET_DIR/release/authd
AUTHBENCH=$TARGET_DIR/release/authbench

WORK=$(mktemp -d "${TMPDIR:-/tmp}/authd-bench.XXXXXX")
SERVER_PID=
stop_server() {
    if [[ -n $SERVER_PID ]]; then
        # SIGTERM: authd drains and exits 0; a server stuck past 30 s is killed.
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 300); do
            kill -0 "$SERVER_PID" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
        SERVER_PID=
    fi
}
BG_PID=
PROBE_PID=
cleanup() {
    [[ -n $BG_PID ]] && kill -TERM "$BG_PID" 2>/dev/null || true
    [[ -n $PROBE_PID ]] && kill -TERM "$PROBE_PID" 2>/dev/null || true
    stop_server
    drop_schema
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
PORT=${BENCH_PORT:-$(free_port)}
HEALTH_PORT=${BENCH_HEALTH_PORT:-$(free_port)}
TARGET=http://127.0.0.1:$PORT
HEALTH_TARGET=http://127.0.0.1:$HEALTH_PORT
TOKEN_KEY="bench:$(head -c 32 /dev/urandom | base64 | tr -d '\n')"

# start_server ITERATIONS [BINARY] [CPUS]: a fresh authd (this revision's, or BINARY)
# on a fresh database, on the server's cores (or CPUS, with a hash thread per core),
# SERVING when it returns.
start_server() {
    local binary=${2:-$AUTHD} cpus=${3:-$SERVER_CPUS} threads=$HASH_THREADS
    [[ -n ${3:-} ]] && threads=$(taskset -c "$3" nproc)
    stop_server
    rm -f "$WORK"/authd.db*
    # authbench acts for its users as a signup service does, each in x-forwarded-for
    # (authbench --forwarded-for), from 127.0.0.1: the one address trusted to say so.
    # Every other setting is authd's default. A baseline BINARY runs with the settings
    # its own suite ran it with (it knows no trusted callers), so its rows are the
    # rates it published.
    # Its log level is the default too: one line per request, refusals within the
    # default budget (AUTHD_LOG_REFUSALS), each server's lines in a log of its own.
    local revision_env=(AUTHD_TRUSTED_CALLERS=127.0.0.1)
    if [[ $binary != "$AUTHD" ]]; then
        revision_env=(AUTHD_HASH_QUEUE=300 AUTHD_MAX_IN_FLIGHT_PER_CLIENT=4096
            AUTHD_REGISTER_LIMIT=off AUTHD_LOG=warn)
    fi
    env AUTHD_LISTEN="127.0.0.1:$PORT" \
        AUTHD_DATABASE_URL="${DATABASE_URL:-sqlite://$WORK/authd.db}" \
        AUTHD_PBKDF2_ITERATIONS="$1" \
        AUTHD_HASH_THREADS="$threads" \
        "${revision_env[@]}" \
        AUTHD_TOKEN_KEYS="$TOKEN_KEY" \
        AUTHD_METRICS_LISTEN= \
        AUTHD_HEALTH_LISTEN="127.0.0.1:$HEALTH_PORT" \
        taskset -c "$cpus" "$binary" >"$WORK/server.log" 2>&1 &
    SERVER_PID=$!
    if ! "$AUTHBENCH" health --target "$TARGET" --requests 1 --concurrency 1 \
        --wait 30s --json >/dev/null; then
        tail -n 20 "$WORK/server.log" >&2
        die "authd did not become SERVING on $TARGET"
    fi
}

# peak_rss_kb: the server's VmHWM, the most resident memory it has had.
peak_rss_kb() {
    awk '/^VmHWM:/ { print $2 }' "/proc/$SERVER_PID/status"
}

# bench OUTFILE TARGET ARGS...: authbench pinned to the client cores, JSON to OUTFILE.
bench() {
    local out=$1 target=$2
    shift 2
    taskset -c "$CLIENT_CPUS" "$AUTHBENCH" "$@" --target "$target" \
        --threads "$CLIENT_THREADS" --json >"$out" ||
        die "authbench $* failed (server log: $(tail -n 3 "$WORK/server.log" | tr '\n' ' '))"
    kill -0 "$SERVER_PID" 2>/dev/null || die "the server exited during authbench $*"
}

# hash_bench WHEN: the hash-bound limit at each cost, on the server's cores. It runs
# before and after the scenarios; the table uses the higher of the two, so a burst of
# other work on the machine cannot lower the limit and flatter QPS / limit.
hash_bench() {
    echo "== hash-bound limit, $1 (authd hash-bench on CPU $SERVER_CPUS," \
        "$HASH_THREADS thread(s))" >&2
    for iterations in 600000 100000 10000; do
        taskset -c "$SERVER_CPUS" "$AUTHD" hash-bench --iterations "$iterations" \
            --threads "$HASH_THREADS" --duration 5s --compare --json \
            >"$WORK/hash-$iterations-$1.json"
        if [[ -n ${BENCH_BASELINE_AUTHD:-} ]]; then
            taskset -c "$SERVER_CPUS" "$BENCH_BASELINE_AUTHD" hash-bench \
                --iterations "$iterations" --threads "$HASH_THREADS" --duration 5s --json \
                >"$WORK/hash-$iterations-$1-baseline.json"
        fi
    done
    # The report's service hashes with hashlib, one hash per request on its thread
    # pool (hashlib lets go of the GIL while it hashes): its own limit, at 10k.
    if [[ -n $REPORT_PYTHON ]]; then
        taskset -c "$SERVER_CPUS" "$REPORT_PYTHON" - 10000 "$HASH_THREADS" 5 \
            >"$WORK/hash-10000-$1-report.json" <<'PY'
import hashlib, json, os, ssl, sys, threading, time
iterations, threads, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
counts = [0] * threads
start = time.perf_counter()
stop = start + seconds
def work(i):
    while time.perf_counter() < stop:
        hashlib.pbkdf2_hmac("sha256", b"authbench-password-1", os.urandom(16), iterations)
        counts[i] += 1
pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
for t in pool:
    t.start()
for t in pool:
    t.join()
elapsed = time.perf_counter() - start
total = sum(counts)
print(json.dumps({
    "hashes_per_second": total / elapsed, "threads": threads,
    "ms_per_hash": 1000 * elapsed * threads / max(total, 1),
    "python": sys.version.split()[0], "openssl": ssl.OPENSSL_VERSION,
}))
PY
    fi
}

# The report's service: a virtualenv with its requirements, made once per version of
# requirements.txt and reused; REPORT_PYTHON is its python, empty when the rows are
# skipped (REPORT_SKIPPED says why).
REPORT_PYTHON=
REPORT_SKIPPED=
REPORT_VERSIONS=
REPORT_DIR=$ROOT/bench/report-service
report_service_venv() {
    local requirements=$REPORT_DIR/requirements.txt key cache venv log
    key=$(sha256sum "$requirements" | cut -c1-16)
    cache=${XDG_CACHE_HOME:-$HOME/.cache}/authd-bench
    venv=$cache/report-service-venv-$key
    if [[ -f $venv/.complete ]] && "$venv/bin/python" -c 'import fastapi, uvicorn' 2>/dev/null; then
        REPORT_PYTHON=$venv/bin/python
        return 0
    fi
    echo "== the report's service: making its virtualenv in $venv" >&2
    log=$WORK/report-service-venv.log
    rm -rf "$venv"
    if ! mkdir -p "$cache" >"$log" 2>&1 ||
        ! python3 -m venv "$venv" >>"$log" 2>&1 ||
        ! "$venv/bin/python" -m pip install --disable-pip-version-check -q \
            -r "$requirements" >>"$log" 2>&1; then
        REPORT_SKIPPED="installing bench/report-service/requirements.txt into a virtualenv failed: $(tail -n 3 "$log" | tr '\n' ' ' | sed 's/ *$//')"
        rm -rf "$venv"
        return 1
    fi
    touch "$venv/.complete"
    REPORT_PYTHON=$venv/bin/python
}
# Its 5,000 connections need as many open files (authbench raises its own limit);
# children inherit the soft limit raised here.
REPORT_FILES=6000
raise_open_files() {
    local hard
    hard=$(ulimit -Hn)
    if [[ $hard != unlimited ]] && ((hard < REPORT_FILES)); then
        REPORT_SKIPPED="the open-files hard limit ($hard) is below the $REPORT_FILES that 5,000 connections need (raise it: ulimit -Hn)"
        return 1
    fi
    if [[ $(ulimit -Sn) != unlimited ]] && (($(ulimit -Sn) < REPORT_FILES)); then
        ulimit -Sn "$hard"
    fi
}
if [[ $REPORT_SERVICE == off ]]; then
    REPORT_SKIPPED="BENCH_REPORT_SERVICE=off"
elif raise_open_files && report_service_venv; then
    REPORT_VERSIONS=$("$REPORT_PYTHON" -c 'import sys, ssl, fastapi, uvicorn
print(f"Python {sys.version.split()[0]} ({ssl.OPENSSL_VERSION}), fastapi {fastapi.__version__}, uvicorn {uvicorn.__version__}")')
fi
if [[ -n $REPORT_SKIPPED ]]; then
    echo "seed-table.sh: warning: the report's service's rows are skipped: $REPORT_SKIPPED" >&2
fi

# start_report_service ITERATIONS: the report's service, fresh, on a fresh SQLite
# file, on the server's cores with one uvicorn worker; answering GET /health when it
# returns. Its accept backlog is ample for thousands of connections opening together
# (the kernel caps it at net.core.somaxconn); a stop waits 5 s at most for the requests
# still queued in it.
start_report_service() {
    stop_server
    rm -f "$WORK"/report-service.db*
    env REPORT_SERVICE_DATABASE="$WORK/report-service.db" REPORT_SERVICE_ITERATIONS="$1" \
        REPORT_SERVICE_TOKEN_KEY="$TOKEN_KEY" \
        taskset -c "$SERVER_CPUS" "$REPORT_PYTHON" -m uvicorn app:app \
        --app-dir "$REPORT_DIR" --host 127.0.0.1 --port "$PORT" --workers 1 \
        --backlog 8192 --log-level warning --no-access-log --timeout-graceful-shutdown 5 \
        >>"$WORK/server.log" 2>&1 &
    SERVER_PID=$!
    if ! python3 - "$TARGET/health" "$SERVER_PID" <<'PY'; then
import os, sys, time, urllib.request
url, pid = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit(1)
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            if 200 <= answer.status < 300:
                sys.exit(0)
    except OSError:
        pass
    time.sleep(0.1)
sys.exit(1)
PY
        tail -n 20 "$WORK/server.log" >&2
        die "the report's service did not answer GET /health on $TARGET"
    fi
}

hash_bench before

# name | iterations | scenario | concurrency | background load | authbench flags
# The background load (authbench arguments) starts first, on a separate authbench
# process and so separate connections, and outlasts the row's warm-up and
# measurement. Overload runs twice: with clients that ask again at once when
# refused (the closed loop of the original report), and with clients that wait out
# the RetryInfo hint. Overload logins use one account per request in flight, so no
# login waits for another attempt on its account (the login throttle's rule). Every
# row sends authbench's default deadline, 10 s, unless it says otherwise, and from
# 127.0.0.1 on behalf of one end user per account and per registration
# (--forwarded-for, added below).
# "polite" is a client of its own address (127.0.0.2), untrusted and forwarding
# nothing, with 20 logins in flight, alone and beside 2,000 that re-ask at once.
EAGER_LOGINS="login --concurrency 2000 --users 2000"
SCENARIOS=(
    "login|600000|login|100||"
    "login|100000|login|100||"
    "register|100000|register|100||"
    "login|10000|login|200||"
    "register|10000|register|100||"
    "register|10000|register|3000||"
    "register, clients back off|10000|register|3000||--backoff"
    "health under register load|10000|health|100|register --concurrency 3000|"
)
# The overload rows and the uncongested rows they are set against, each overload row
# right after its uncongested one: run BENCH_OVERLOAD_RUNS times over, so that the
# ratios of the summary are medians of pairs measured a minute apart rather than one
# pair on a shared, noisy machine.
OVERLOAD_ROWS=(
    "login|10000|login|100||"
    "login overload, clients re-ask at once|10000|login|2000||--users 2000"
    "login overload, clients back off|10000|login|2000||--users 2000 --backoff"
    "register|10000|register|300||"
    "register overload, clients re-ask at once|10000|register|5000||"
    "register overload, clients back off|10000|register|5000||--backoff"
    "login, 1 s deadlines, clients re-ask at once|10000|login|5000||--users 5000 --timeout 1s"
    "polite client alone|10000|login|20||--users 20 --bind 127.0.0.2"
    "polite client beside 2,000 re-asking at once|10000|login|20|$EAGER_LOGINS|--users 20 --bind 127.0.0.2"
)
# The report's service (rows named "report's service, …"): no deadline travels with
# an HTTP request and it bounds no queue (5,000 registrations in flight wait some 25 s
# for their turn), so its clients wait up to 120 s: a client that gave up at authd's
# 10 s would time out every request of that queue and measure the timeout, not the
# service. That can only favour it.
REPORT="--protocol http --timeout 120s"
if [[ -n $REPORT_PYTHON ]]; then
    SCENARIOS+=(
        "report's service, login|10000|login|100||$REPORT"
        "report's service, login overload, clients re-ask at once|10000|login|2000||$REPORT --users 2000"
        "report's service, register|10000|register|100||$REPORT"
        "report's service, register overload, clients re-ask at once|10000|register|5000||$REPORT"
    )
fi
if [[ -n ${BENCH_POSTGRES_URL:-} ]]; then
    command -v psql >/dev/null || die "BENCH_POSTGRES_URL needs psql"
    SCENARIOS+=(
        "login, PostgreSQL|10000|login|100||"
        "register, PostgreSQL|10000|register|300||"
        "register overload, PostgreSQL, clients back off|10000|register|5000||--backoff"
    )
fi
BASELINE_OVERLOAD_ROWS=()
if [[ -n ${BENCH_BASELINE_AUTHD:-} ]]; then
    [[ -x $BENCH_BASELINE_AUTHD ]] || die "BENCH_BASELINE_AUTHD: $BENCH_BASELINE_AUTHD is not an executable"
    for row in "${SCENARIOS[@]}"; do
        IFS='|' read -r name rest <<<"$row"
        [[ $name == "report's service"* || $name == *PostgreSQL* ]] && continue
        SCENARIOS+=("$name, baseline|$rest")
    done
    for row in "${OVERLOAD_ROWS[@]}"; do
        IFS='|' read -r name rest <<<"$row"
        BASELINE_OVERLOAD_ROWS+=("$name, baseline|$rest")
    done
fi
PG_SCHEMA=
drop_schema() {
    if [[ -n $PG_SCHEMA ]]; then
        psql -q "$BENCH_POSTGRES_URL" -c "DROP SCHEMA IF EXISTS $PG_SCHEMA CASCADE" >/dev/null
        PG_SCHEMA=
    fi
}
# Every row to run, each with its run of the overload rows (empty for the others).
RUNS=()
for row in "${SCENARIOS[@]}"; do
    RUNS+=("$row|")
done
for ((run = 1; run <= OVERLOAD_RUNS; run++)); do
    for row in "${OVERLOAD_ROWS[@]}" "${BASELINE_OVERLOAD_ROWS[@]}"; do
        RUNS+=("$row|$run")
    done
done
MANIFEST=$WORK/manifest.tsv
: >"$MANIFEST"
i=0
for row in "${RUNS[@]}"; do
    IFS='|' read -r name iterations scenario concurrency load flags run <<<"$row"
    i=$((i + 1))
    echo "== [$i/${#RUNS[@]}] $name${run:+ (run $run of $OVERLOAD_RUNS)}: PBKDF2 $iterations," \
        "concurrency $concurrency" >&2
    DATABASE_URL=
    drop_schema
    if [[ $name == *PostgreSQL* ]]; then
        # A fresh schema per row, like the fresh SQLite file of the others.
        PG_SCHEMA="authd_bench_$$_$i"
        psql -q "$BENCH_POSTGRES_URL" -c "CREATE SCHEMA $PG_SCHEMA" >/dev/null
        sep='?'
        [[ $BENCH_POSTGRES_URL == *\?* ]] && sep='&'
        DATABASE_URL="$BENCH_POSTGRES_URL${sep}options[search_path]=$PG_SCHEMA"
    fi
    if [[ $name == "report's service"* ]]; then
        start_report_service "$iterations"
    else
        binary=$AUTHD
        [[ $name == *baseline* ]] && binary=$BENCH_BASELINE_AUTHD
        start_server "$iterations" "$binary"
    fi
    # authd's rows act for one end user per account and per registration (see the
    # scenarios above); the report's service and a client of its own address forward
    # nothing.
    forward=()
    [[ $name != "report's service"* ]] && forward=(--forwarded-for 131072)
    json=$WORK/run-$i.json
    background=
    if [[ -n $load ]]; then
        background=$WORK/run-$i-background.json
        # shellcheck disable=SC2086 # load is a list of words
        taskset -c "$CLIENT_CPUS" "$AUTHBENCH" $load "${forward[@]}" \
            --duration "$((WARMUP + DURATION + 11))s" --warmup 1s --target "$TARGET" \
            --threads "$CLIENT_THREADS" --json >"$background" &
        BG_PID=$!
        # Long enough for the background to register its users (--users) and be
        # loading the server before this row's warm-up ends.
        if [[ $load == *--users* ]]; then sleep 10; else sleep 2; fi
    fi
    # The prober: Kubernetes' probes, on the health-only port, at 20 a second (the
    # report's service has no such port: no prober).
    probe=
    if [[ $name != "report's service"* ]]; then
        probe=$WORK/run-$i-probe.json
        taskset -c "$CLIENT_CPUS" "$AUTHBENCH" health --rate 20 --target "$HEALTH_TARGET" \
            --duration "${DURATION}s" --warmup "${WARMUP}s" --threads 1 --json >"$probe" &
        PROBE_PID=$!
    fi
    # Probes go to the health-only port, as the shipped Kubernetes manifests do.
    target=$TARGET
    [[ $scenario == health ]] && target=$HEALTH_TARGET
    [[ $flags == *--bind* ]] && forward=()
    # shellcheck disable=SC2086 # flags is a list of words
    bench "$json" "$target" "$scenario" --concurrency "$concurrency" \
        --warmup "${WARMUP}s" --duration "${DURATION}s" $flags "${forward[@]}"
    if [[ -n $PROBE_PID ]]; then
        wait "$PROBE_PID" || die "the health prober failed"
    fi
    PROBE_PID=
    if [[ -n $BG_PID ]]; then
        wait "$BG_PID" || die "the background load failed"
        BG_PID=
    fi
    rss=$(peak_rss_kb)
    stop_server
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$iterations" "$concurrency" \
        "$json" "$rss" "$background" "$load" "$probe" "$run" >>"$MANIFEST"
done

drop_schema

# Users arriving at once, as people do after an outage or at the start of a day:
# AT_ONCE_USERS logins sent together, one per user, each with a 10 s deadline and no
# retry, at the default cost, with the server on every core (a hash thread per core;
# authbench beside it sends only these requests), BENCH_OVERLOAD_RUNS times; the
# baseline too.
AT_ONCE_USERS=300
AT_ONCE=$WORK/at-once.tsv
: >"$AT_ONCE"
at_once=("$AUTHD|authd")
[[ -n ${BENCH_BASELINE_AUTHD:-} ]] && at_once+=("$BENCH_BASELINE_AUTHD|baseline")
ALL_CPUS=$(cpu_range 0 $((NPROC - 1)))
for ((run = 1; run <= OVERLOAD_RUNS; run++)); do
    for entry in "${at_once[@]}"; do
        IFS='|' read -r binary label <<<"$entry"
        echo "== $AT_ONCE_USERS users at once, PBKDF2 600000, every core: $label (run $run)" >&2
        start_server 600000 "$binary" "$ALL_CPUS"
        json=$WORK/at-once-$label-$run.json
        "$AUTHBENCH" login --target "$TARGET" --concurrency "$AT_ONCE_USERS" \
            --requests "$AT_ONCE_USERS" --users "$AT_ONCE_USERS" --forwarded-for 131072 \
            --timeout 10s --threads "$CLIENT_THREADS" --json >"$json" ||
            die "authbench failed for $AT_ONCE_USERS users at once ($label)"
        stop_server
        printf '%s\t%s\t%s\n' "$label" "$run" "$json" >>"$AT_ONCE"
    done
done

hash_bench after

CPU_MODEL=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo)
MEMORY=$(awk '/^MemTotal:/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)
REVISION=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [[ -n $(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null) ]]; then
    REVISION+=" (with uncommitted changes)"
fi

mkdir -p "$(dirname "$OUT")"
python3 - "$MANIFEST" "$WORK" "$REPORT_SKIPPED" "$OVERLOAD_RUNS" "$AT_ONCE" "$ALL_CPUS" \
    >"$WORK/table.md" <<'PY'
import json, statistics, sys

manifest, work, report_skipped = sys.argv[1], sys.argv[2], sys.argv[3]
overload_runs = int(sys.argv[4])
at_once_runs, all_cpus = sys.argv[5], sys.argv[6]
import os
REPORT = "report's service"
limits, measured = {}, {}
for it in (600000, 100000, 10000):
    for kind in ("", "-baseline", "-report"):
        paths = [f"{work}/hash-{it}-{when}{kind}.json" for when in ("before", "after")]
        if not all(os.path.exists(p) for p in paths):
            continue
        runs = [json.load(open(p)) for p in paths]
        measured[(it, kind)] = runs
        limits[(it, kind)] = max(runs, key=lambda h: h["hashes_per_second"])

def ms(x):
    return "—" if x is None else f"{x:.1f}"

def short(it):
    return f"{it // 1000}k"

print("| scenario | config | concurrency | QPS | avg (ms) | p99 (ms) | success rate "
      "| hash-bound limit (/s) | QPS / limit | RESOURCE_EXHAUSTED | p99 all (ms) "
      "| other errors | probe p99 (ms) | server peak RSS (MB) |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
notes = []
rows = {}
for line in open(manifest):
    name, it, conc, path, rss, background, load, probe, run = line.rstrip("\n").split("\t")
    # The report's service has no health-only port: no prober, an empty column.
    probed = json.load(open(probe)) if probe else None
    probe_p99 = (probed.get("latency_ms") or {}).get("p99") if probed else None
    probe_bad = probed["requests"] - probed["ok"] if probed else 0
    it = int(it)
    r = json.load(open(path))
    ok = r.get("ok_latency_ms") or {}
    every = r.get("latency_ms") or {}
    requests = r["requests"] or 1
    codes = r["codes"]
    refused = codes.get("RESOURCE_EXHAUSTED", 0)
    other = sum(n for c, n in codes.items() if c not in ("OK", "RESOURCE_EXHAUSTED"))
    other += r["client_errors"]["connection"] + r["client_errors"]["timeout"]
    other_detail = ", ".join(f"{c} {n}" for c, n in codes.items()
                             if c not in ("OK", "RESOURCE_EXHAUSTED"))
    hashes = r["scenario"] in ("login", "register")
    kind = "-baseline" if "baseline" in name else "-report" if name.startswith(REPORT) else ""
    limit = limits[(it, kind)]["hashes_per_second"] if hashes and (it, kind) in limits else None
    rate = r["ok_qps"]
    rows.setdefault(name, {}).setdefault((it, int(conc)), []).append(
        dict(rate=rate, p99=ok.get("p99"), success=r["ok"] / requests, probe=probe_p99))
    label = f"{name} (run {run})" if run and overload_runs > 1 else name
    print(f"| {label} | PBKDF2 {short(it)} | {conc} | {rate:.0f} | {ms(ok.get('avg'))} "
          f"| {ms(ok.get('p99'))} | {100 * r['ok'] / requests:.1f} % "
          f"| {'—' if limit is None else f'{limit:.0f}'} "
          f"| {'—' if limit is None else f'{rate / limit:.2f}'} "
          f"| {100 * refused / requests:.1f} % | {ms(every.get('p99'))} "
          f"| {other}{f' ({other_detail})' if other_detail else ''} "
          f"| {'' if not probed else ms(probe_p99)}"
          f"{f' ({probe_bad} failed)' if probe_bad else ''} "
          f"| {int(rss) / 1024:.0f} |")
    if background:
        b = json.load(open(background))
        bref = b["codes"].get("RESOURCE_EXHAUSTED", 0)
        notes.append(f"- {name}: the background `authbench {load}` ran at "
                     f"{b['ok_qps']:.0f} successful req/s, "
                     f"{100 * b['ok'] / max(b['requests'], 1):.1f} % answered OK, "
                     f"{100 * bref / max(b['requests'], 1):.1f} % RESOURCE_EXHAUSTED, "
                     f"p99 of its successes {ms((b.get('ok_latency_ms') or {}).get('p99'))} ms.")
print()
for (it, kind), h in limits.items():
    before, after = (m["hashes_per_second"] for m in measured[(it, kind)])
    if kind == "-report":
        print(f"- Hash-bound limit at PBKDF2 {short(it)} (the report's service: "
              f"hashlib.pbkdf2_hmac, Python {h['python']}, {h['openssl']}): "
              f"{h['hashes_per_second']:.1f} hashes/s on {h['threads']} thread(s) "
              f"({h['ms_per_hash']:.2f} ms per hash): the higher of {before:.1f} before and "
              f"{after:.1f} after the scenarios, pinned to the server's cores.")
        continue
    who = "the baseline's" if kind else "this revision's"
    engine = f", engine {h['backend']}, batch {h['batch']}" if "backend" in h else ""
    print(f"- Hash-bound limit at PBKDF2 {short(it)} ({who} authd{engine}): "
          f"{h['hashes_per_second']:.1f} hashes/s on {h['threads']} thread(s) "
          f"({h['ms_per_hash']:.2f} ms per batch): the higher of {before:.1f} before and "
          f"{after:.1f} after the scenarios, from `authd hash-bench --iterations {it} "
          f"--threads {h['threads']} --duration 5s`.")
    crate = h.get("pbkdf2_crate")
    if crate:
        print(f"  In the same run the pbkdf2 crate (one hash at a time) did "
              f"{crate['hashes_per_second']:.1f} hashes/s "
              f"({crate['ns_per_compression']:.1f} ns per SHA-256 compression, against the "
              f"engine's {h['ns_per_compression']:.1f}): engine / crate = "
              f"{h['hashes_per_second'] / crate['hashes_per_second']:.2f}.")
for n in notes:
    print(n)

# Overload against the uncongested rows of the same run (10k rounds), as the overload
# issue defines them: logins at 100 in flight, registrations at 300 (the largest
# concurrency not meant as overload), the polite client alone.
def runs(name, conc):
    return (rows.get(name) or {}).get((10000, conc)) or []

def row(name, conc):
    """The median of a row's runs (its rate, p99 and success rate each)."""
    rs = runs(name, conc)
    if not rs:
        return None
    def median(key):
        xs = [r[key] for r in rs if r[key] is not None]
        return statistics.median(xs) if xs else None
    return dict(rate=median("rate"), p99=median("p99"), success=median("success"))

def spread(ratios):
    """A median of ratios, with their range when there are several."""
    mid = f"{statistics.median(ratios):.2f}"
    if len(ratios) < 2:
        return mid
    return f"{mid} ({min(ratios):.2f}–{max(ratios):.2f})"

print()
print("## Overload, against the uncongested rows of this run")
print()
print("Uncongested: login at 100 in flight, register at 300, the polite client alone.")
if overload_runs > 1:
    print(f"Each overload row ran {overload_runs} times, each time right after its "
          "uncongested row: a ratio is the median of the runs' ratios, with their range; "
          "the success rate is the lowest of the runs.")
print()
print("| row | QPS / uncongested QPS | p99 / uncongested p99 | success rate |")
print("|---|---:|---:|---:|")
for suffix in ("", ", baseline"):
    pairs = [
        (f"login overload, clients re-ask at once{suffix}", 2000, f"login{suffix}", 100),
        (f"login overload, clients back off{suffix}", 2000, f"login{suffix}", 100),
        (f"register overload, clients re-ask at once{suffix}", 5000, f"register{suffix}", 300),
        (f"register overload, clients back off{suffix}", 5000, f"register{suffix}", 300),
        (f"login, 1 s deadlines, clients re-ask at once{suffix}", 5000, f"login{suffix}", 100),
        (f"polite client beside 2,000 re-asking at once{suffix}", 20,
         f"polite client alone{suffix}", 20),
    ]
    for name, conc, base_name, base_conc in pairs:
        # Each run against the uncongested run just before it.
        paired = [(o, b) for o, b in zip(runs(name, conc), runs(base_name, base_conc))
                  if b["rate"] and b["p99"]]
        if not paired:
            continue
        rates = [o["rate"] / b["rate"] for o, b in paired]
        p99s = [o["p99"] / b["p99"] for o, b in paired if o["p99"] is not None]
        success = min(o["success"] for o, _ in paired)
        print(f"| {name} | {spread(rates)} | {spread(p99s) if p99s else '—'} "
              f"| {100 * success:.1f} % |")
# Users at once: how many of them were answered OK, and when the last answer came.
print()
print("## Users logging in at once")
print()
print(f"Each run: {{n}} logins sent together, one per user, a 10 s deadline, no retry, "
      f"PBKDF2 600k, the server on CPU {all_cpus} with a hash thread per core.".replace(
          "{n}", "the users'"))
print()
print("| server | run | answered OK | refused | other | last answer (ms) | p50 (ms) |")
print("|---|---:|---:|---:|---:|---:|---:|")
for line in open(at_once_runs):
    label, run, path = line.rstrip("\n").split("\t")
    r = json.load(open(path))
    codes = r["codes"]
    other = sum(n for c, n in codes.items() if c not in ("OK", "RESOURCE_EXHAUSTED"))
    other += r["client_errors"]["connection"] + r["client_errors"]["timeout"]
    every = r.get("latency_ms") or {}
    print(f"| {label} | {run} | {r['ok']} of {r['requests']} "
          f"| {codes.get('RESOURCE_EXHAUSTED', 0)} | {other} | {ms(every.get('max'))} "
          f"| {ms(every.get('p50'))} |")
# authd against the report's service, in the same run on the same cores: the issue's
# targets, with clients that re-ask at once.
print()
print("## Against the report's service, in this run")
print()
if report_skipped:
    print(f"The report's service was not measured in this run ({report_skipped}).")
else:
    if overload_runs > 1:
        print(f"authd's accepted/s: the median of its {overload_runs} runs.")
        print()
    print("| requests | in flight | authd accepted/s | the report's service accepted/s "
          "| authd ÷ the report's service | target |")
    print("|---|---:|---:|---:|---:|---|")
    for what, conc in (("login", 2000), ("register", 5000)):
        name = f"{what} overload, clients re-ask at once"
        ours, theirs = row(name, conc), row(f"{REPORT}, {name}", conc)
        if not ours or not theirs:
            continue
        if theirs["rate"]:
            times = ours["rate"] / theirs["rate"]
            verdict = f"≥ 3.5×: {'met' if times >= 3.5 else 'not met'}"
            times = f"{times:.2f}×"
        else:
            times, verdict = "—", "≥ 3.5×: met (the report's service accepted none)"
        print(f"| {name} | {conc} | {ours['rate']:.0f} | {theirs['rate']:.0f} | {times} "
              f"| {verdict} |")
    print()
    for what, base, over in (("login", 100, 2000), ("register", 100, 5000)):
        calm = row(f"{REPORT}, {what}", base)
        loaded = row(f"{REPORT}, {what} overload, clients re-ask at once", over)
        if calm and loaded and calm["rate"]:
            print(f"- The report's service alone: {what} at {over:,} in flight ran at "
                  f"{loaded['rate'] / calm['rate']:.2f}× its rate at {base} "
                  f"({loaded['rate']:.0f} against {calm['rate']:.0f} accepted/s), "
                  f"{100 * loaded['success']:.1f} % of its answers accepted.")
probes = [(v["probe"], n) for n, by in rows.items() for rs in by.values() for v in rs
          if v["probe"] is not None and "baseline" not in n]
if probes:
    worst, where = max(probes)
    print()
    print(f"The health probes' p99, worst row of this revision: {worst:.1f} ms ({where}).")
PY

{
    echo "# authd benchmark: the seed table"
    echo
    echo "- Machine: $NPROC cores ($CPU_MODEL), $MEMORY of memory, $(uname -sr)"
    echo "- Date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    baseline=
    if [[ -n ${BENCH_BASELINE_AUTHD:-} ]]; then
        baseline=" BENCH_BASELINE_AUTHD=$BENCH_BASELINE_AUTHD"
    fi
    echo "- Command: \`$COMMAND\`" \
        "(BENCH_DURATION=$DURATION BENCH_WARMUP=$WARMUP" \
        "BENCH_OVERLOAD_RUNS=$OVERLOAD_RUNS$baseline)"
    echo "- authd revision: $REVISION"
    echo "- Layout: authd on CPU $SERVER_CPUS (AUTHD_HASH_THREADS=$HASH_THREADS, its" \
        "other settings the defaults but AUTHD_TRUSTED_CALLERS=127.0.0.1), authbench on" \
        "CPU $CLIENT_CPUS ($CLIENT_THREADS runtime thread(s); from 127.0.0.1 on behalf of" \
        "one end user per account and per registration, --forwarded-for); each scenario" \
        "on a freshly started authd with a new SQLite file; closed loop, 10 s deadlines" \
        "unless the row says otherwise, ${WARMUP} s warm-up (not counted), then" \
        "${DURATION} s measured."
    if [[ -n $REPORT_PYTHON ]]; then
        echo "- The report's service: bench/report-service ($REPORT_VERSIONS), one uvicorn" \
            "worker on CPU $SERVER_CPUS, freshly started per row on a new SQLite file;" \
            "authbench --protocol http --timeout 120s, the same warm-up and measurement."
    else
        echo "- The report's service: not measured ($REPORT_SKIPPED)."
    fi
    echo
    cat "$WORK/table.md"
    echo
    echo "QPS counts successful answers per second; avg and p99 are over the successful"
    echo "requests (the ones authd accepted), p99 all over every answer including refusals."
    echo "Refused requests are retried at once by the closed loop, so under overload the"
    echo "client keeps the server busy refusing; in the rows marked \"clients back off\""
    echo "(authbench --backoff) a refused client first waits the RetryInfo delay (jittered"
    echo "between half and one and a half times it), as a well-behaved gRPC client does."
    echo "Other errors are every status but OK and"
    echo "RESOURCE_EXHAUSTED, plus client-side connection errors and timeouts. QPS / limit"
    echo "compares with the hash-bound limit measured in the same run on the server's cores."
    echo "Peak RSS is the server's VmHWM at the end of the scenario (one server per row)."
    echo "Probe p99 is the p99 of the health checks sent to the health-only port 20 times"
    echo "a second during the row. authd holds a refusal before answering it (see"
    echo "docs/operations.md, Overload), so p99 all includes those holds."
    if [[ -n $REPORT_PYTHON ]]; then
        echo
        echo "Rows named \"report's service\" measure bench/report-service, a FastAPI + SQLite"
        echo "service of the kind authd replaces (PBKDF2-SHA256 with hashlib at the same 10k"
        echo "rounds, plain \`def\` endpoints on FastAPI's thread pool, SQLite's defaults), on the"
        echo "same cores in the same run, with authbench --protocol http: HTTP/1.1 carries one"
        echo "request at a time, so each request in flight has a keep-alive connection of its own,"
        echo "and its answers count as the gRPC codes they stand for (401 UNAUTHENTICATED, 409"
        echo "ALREADY_EXISTS, 429 RESOURCE_EXHAUSTED, 503 UNAVAILABLE, other 5xx INTERNAL). It"
        echo "refuses nothing and bounds no queue: under overload every request waits its turn,"
        echo "so its clients wait up to 120 s for an answer (authd's rows keep authbench's 10 s),"
        echo "which can only favour it. A request it fails (SQLite's \"database is locked\" is a"
        echo "500 and a closed connection) counts among other errors. Its hash-bound limit is"
        echo "hashlib's rate on the server's cores; it has no health-only port, so no probe."
        echo "Accepted/s, in the table against it, is the QPS column: successful answers per second."
    fi
} >"$OUT"

cat "$OUT"
echo "== written to ${OUT#"$ROOT"/}" >&2
