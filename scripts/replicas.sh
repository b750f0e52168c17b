#!/usr/bin/env bash
# Runs N authd replicas on one machine, without Docker: release binaries on
# consecutive ports, sharing one PostgreSQL database, one Redis and one token key
# ring. Waits until every replica reports SERVING, then until Ctrl-C (or SIGTERM),
# and stops them all gracefully (each drains, then exits 0).
#
#   scripts/replicas.sh -n 3 --database-url postgres://postgres@127.0.0.1:5432/authd \
#       --redis-url redis://127.0.0.1:6379
#
# Any other AUTHD_* variable in the environment reaches every replica unchanged
# (AUTHD_RATE_LIMITS, AUTHD_PBKDF2_ITERATIONS, AUTHD_TOKEN_KEYS, …). Without
# AUTHD_TOKEN_KEYS or AUTHD_TOKEN_KEYS_FILE, a random key ring is made for this run
# and given to every replica, so a token from one is valid on the others.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: scripts/replicas.sh [options]

  -n, --replicas N         how many replicas (default 3)
  -p, --base-port PORT     replica i listens on PORT+i-1 (default 50061)
      --host IP            address to listen on (default 127.0.0.1)
      --metrics-base-port PORT
                           replica i serves GET /metrics on PORT+i-1 (default 9091; 0: none)
  -d, --database-url URL   postgres://… shared by the replicas (default: $AUTHD_DATABASE_URL)
  -r, --redis-url URL      redis://… for rate limits shared by the replicas
                           (default: $AUTHD_REDIS_URL; without it each replica limits alone)
      --bin PATH           the authd binary (default: target/release/authd, built if missing)
      --log-dir DIR        one log file (and pid file) per replica (default: a new temp dir)
      --ready-timeout SECS how long each replica may take to report SERVING (default 60)
  -h, --help               this help
EOF
}

root="$(cd "$(dirname "$0")/.." && pwd)"
replicas=3
base_port=50061
metrics_base_port=9091
host=127.0.0.1
database_url="${AUTHD_DATABASE_URL:-}"
redis_url="${AUTHD_REDIS_URL:-}"
bin=""
log_dir=""
ready_timeout=60

die() { echo "replicas.sh: error: $*" >&2; exit 2; }
need() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value"; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        -n|--replicas) need "$@"; replicas="$2"; shift 2 ;;
        -p|--base-port) need "$@"; base_port="$2"; shift 2 ;;
        --host) need "$@"; host="$2"; shift 2 ;;
        --metrics-base-port) need "$@"; metrics_base_port="$2"; shift 2 ;;
        -d|--database-url) need "$@"; database_url="$2"; shift 2 ;;
        -r|--redis-url) need "$@"; redis_url="$2"; shift 2 ;;
        --bin) need "$@"; bin="$2"; shift 2 ;;
        --log-dir) need "$@"; log_dir="$2"; shift 2 ;;
        --ready-timeout) need "$@"; ready_timeout="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done

[[ "$replicas" =~ ^[1-9][0-9]*$ ]] || die "--replicas must be a positive number, not '$replicas'"
if ! [[ "$base_port" =~ ^[0-9]+$ ]] || (( base_port < 1 || base_port + replicas - 1 > 65535 )); then
    die "--base-port '$base_port' leaves no room for $replicas ports"
fi
if ! [[ "$metrics_base_port" =~ ^[0-9]+$ ]] \
    || (( metrics_base_port > 0 && metrics_base_port + replicas - 1 > 65535 )); then
    die "--metrics-base-port '$metrics_base_port' leaves no room for $replicas ports"
fi
[[ "$ready_timeout" =~ ^[1-9][0-9]*$ ]] || die "--ready-timeout must be whole seconds"
case "$database_url" in
    postgres://*|postgresql://*) ;;
    "") die "--database-url (or AUTHD_DATABASE_URL) is required: replicas share one PostgreSQL database" ;;
    *) die "--database-url must be postgres://…: replicas cannot share a SQLite file" ;;
esac

if [[ -z "$bin" ]]; then
    bin="${CARGO_TARGET_DIR:-$root/target}/release/authd"
    if [[ ! -x "$bin" ]]; then
        echo "building $bin (cargo build --release --bin authd)"
        (cd "$root" && cargo build --release --locked --bin authd)
    fi
fi
[[ -x "$bin" ]] || die "no authd binary at $bin"

if [[ -z "$log_dir" ]]; then
    log_dir="$(mktemp -d "${TMPDIR:-/tmp}/authd-replicas.XXXXXX")"
fi
mkdir -p "$log_dir"

export AUTHD_DATABASE_URL="$database_url"
if [[ -n "$redis_url" ]]; then
    export AUTHD_REDIS_URL="$redis_url"
else
    unset AUTHD_REDIS_URL
    echo "note: no Redis URL: each replica enforces rate limits on its own" >&2
fi
if [[ -z "${AUTHD_TOKEN_KEYS:-}" && -z "${AUTHD_TOKEN_KEYS_FILE:-}" ]]; then
    # One ring for all replicas, for this run only (tokens die with it).
    AUTHD_TOKEN_KEYS="replicas-$(date +%s):$(head -c 32 /dev/urandom | base64)"
    export AUTHD_TOKEN_KEYS
    echo "note: no AUTHD_TOKEN_KEYS: the replicas share a random key made for this run" >&2
fi

pids=()
stopping=0

# Sends SIGTERM to every replica still running and waits for each to drain and exit
# (AUTHD_DRAIN_TIMEOUT plus the close time); one that outlives that is killed.
stop_all() {
    local drain grace deadline pid alive
    drain="${AUTHD_DRAIN_TIMEOUT:-20s}"
    # Whole seconds of the drain timeout when it is given in s/ms; else the default.
    case "$drain" in
        *ms) grace=$(( ${drain%ms} / 1000 + 1 )) ;;
        *s) grace="${drain%s}" ;;
        *) grace=20 ;;
    esac
    [[ "$grace" =~ ^[0-9]+$ ]] || grace=20
    deadline=$(( SECONDS + grace + 10 ))
    for pid in "${pids[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    while :; do
        alive=0
        for pid in "${pids[@]}"; do
            kill -0 "$pid" 2>/dev/null && alive=1
        done
        (( alive == 0 )) && break
        if (( SECONDS >= deadline )); then
            for pid in "${pids[@]}"; do
                if kill -0 "$pid" 2>/dev/null; then
                    echo "replica pid $pid did not stop in time: killing it" >&2
                    kill -KILL "$pid" 2>/dev/null || true
                fi
            done
            break
        fi
        sleep 0.2
    done
    local status=0 rc
    for pid in "${pids[@]}"; do
        rc=0
        wait "$pid" 2>/dev/null || rc=$?
        # 127: already reaped (wait -n below); anything else non-zero is a failure.
        if (( rc != 0 && rc != 127 )); then
            echo "replica pid $pid exited with status $rc" >&2
            status=1
        fi
    done
    rm -f "$log_dir"/replica-*.pid
    return "$status"
}

on_signal() {
    (( stopping )) && return
    stopping=1
    echo
    echo "stopping ${#pids[@]} replicas (draining)…"
    local status=0
    stop_all || status=$?
    (( status == 0 )) && echo "all replicas stopped"
    trap - EXIT
    exit "$status"
}
trap on_signal INT TERM
trap 'stopping=1; stop_all >/dev/null 2>&1 || true' EXIT

# Migrate once, so the replicas do not queue on the migration lock at start (and a
# wrong URL fails here, with authd's own one-line reason).
"$bin" migrate >"$log_dir/migrate.log" 2>&1 || {
    cat "$log_dir/migrate.log" >&2
    die "authd migrate failed"
}

for i in $(seq 1 "$replicas"); do
    port=$(( base_port + i - 1 ))
    log="$log_dir/replica-$i.log"
    # Each replica its own metrics port (an AUTHD_METRICS_LISTEN shared by all would collide).
    metrics=""
    (( metrics_base_port > 0 )) && metrics="$host:$(( metrics_base_port + i - 1 ))"
    # The health-only port is off: the replicas' gRPC ports serve health too, and one
    # default port (50052) shared by all would collide.
    AUTHD_LISTEN="$host:$port" AUTHD_METRICS_LISTEN="$metrics" AUTHD_HEALTH_LISTEN='' \
        "$bin" serve >"$log" 2>&1 &
    pids+=("$!")
    echo "$!" >"$log_dir/replica-$i.pid"
    echo "replica $i: $host:$port, metrics ${metrics:-off} (pid $!, log $log)"
done

# The address to check from here: an unspecified listen address answers on loopback.
check_host="$host"
case "$host" in 0.0.0.0) check_host=127.0.0.1 ;; ::|"[::]") check_host="[::1]" ;; esac
[[ "$check_host" == *:* && "$check_host" != \[* ]] && check_host="[$check_host]"

for i in $(seq 1 "$replicas"); do
    port=$(( base_port + i - 1 ))
    pid="${pids[$((i - 1))]}"
    deadline=$(( SECONDS + ready_timeout ))
    until out="$("$bin" health --addr "$check_host:$port" --service auth.v1.AuthService --timeout 1s 2>&1)"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "replica $i exited before it was SERVING; its log:" >&2
            tail -n 20 "$log_dir/replica-$i.log" >&2
            exit 1
        fi
        if (( SECONDS >= deadline )); then
            echo "replica $i is not SERVING after ${ready_timeout}s: $out" >&2
            exit 1
        fi
        sleep 0.2
    done
done

echo "all $replicas replicas are SERVING; Ctrl-C stops them"

# Wait until a signal (handled by on_signal) or until a replica exits on its own.
while :; do
    rc=0
    wait -n "${pids[@]}" || rc=$?
    (( stopping )) && exit 0
    for i in "${!pids[@]}"; do
        if ! kill -0 "${pids[$i]}" 2>/dev/null; then
            echo "replica $((i + 1)) (pid ${pids[$i]}) exited with status $rc; stopping the others" >&2
            tail -n 20 "$log_dir/replica-$((i + 1)).log" >&2
            stop_all || true
            trap - EXIT
            exit 1
        fi
    done
done
