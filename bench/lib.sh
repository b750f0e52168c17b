# shellcheck shell=bash
# bench/lib.sh: what the pinned comparison scripts share, sourced from the
# repository's root. Sourcing it builds the release binaries and sets AUTHD and
# AUTHBENCH (their paths), WORK (a directory removed on exit, with the server
# still running killed, and every pid the script added to STARTED) and KEY (a
# random token key). The caller sets CONCURRENCY,
# DURATION and WARMUP, and starts its server in the background with `SERVER=$!`
# and `PORT` set; the helpers below wait for it, measure against it and stop it.

cargo build --release --locked -p authd -p authbench >&2
TARGET_DIR=${CARGO_TARGET_DIR:-target}
# shellcheck disable=SC2034 # used by the scripts that source this file
AUTHD=$TARGET_DIR/release/authd
AUTHBENCH=$TARGET_DIR/release/authbench
WORK=$(mktemp -d)
SERVER=""
# Processes a script started beside its servers (Redis, nginx): killed on exit.
STARTED=()
# shellcheck disable=SC2317 # called by the trap
cleanup() {
    local pid
    for pid in "${STARTED[@]}"; do
        { kill "$pid" && wait "$pid"; } 2>/dev/null || true
    done
    [[ -z $SERVER ]] || kill "$SERVER" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
# shellcheck disable=SC2034 # used by the scripts that source this file
KEY="bench:$(head -c 32 /dev/urandom | base64)"

# A free TCP port on 127.0.0.1.
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Waits until the server on PORT is SERVING; shows its log and exits if it is not.
wait_serving() {
    if ! "$AUTHBENCH" health --target "http://127.0.0.1:$PORT" --requests 1 --concurrency 1 \
        --wait 30s --json >/dev/null; then
        tail -n 20 "$WORK/server.log" >&2
        echo "authd did not become SERVING" >&2
        exit 1
    fi
}

# start_pinned BINARY DATABASE_URL [VAR=VALUE…]: a fresh server on CPU 0 with one
# hash thread and the settings every pinned comparison shares (later VAR=VALUE
# override them), on a free PORT; waited for until it answers. authbench registers
# its users from one address: no limit on Register (a binary from before that
# setting ignores it).
start_pinned() {
    local binary=$1 database=$2
    shift 2
    PORT=$(free_port)
    env AUTHD_LISTEN="127.0.0.1:$PORT" AUTHD_DATABASE_URL="$database" \
        AUTHD_PBKDF2_ITERATIONS="$ITERATIONS" AUTHD_HASH_THREADS=1 \
        AUTHD_TOKEN_KEYS="$KEY" AUTHD_REGISTER_LIMIT=off \
        AUTHD_METRICS_LISTEN= AUTHD_HEALTH_LISTEN= AUTHD_LOG=warn "$@" \
        taskset -c 0 "$binary" >>"$WORK/server.log" 2>&1 &
    SERVER=$!
    wait_serving
}

# Stops the server started last.
stop() {
    kill "$SERVER" && wait "$SERVER" 2>/dev/null || true
    SERVER=""
}

# bench SCENARIO: successful answers per second, authbench pinned to CPU 1.
bench() {
    taskset -c 1 "$AUTHBENCH" "$1" --target "http://127.0.0.1:$PORT" \
        --concurrency "$CONCURRENCY" --duration "${DURATION}s" --warmup "${WARMUP}s" --json \
        | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["ok_qps"]))'
}

# peak_rss_mb: the running server's most resident memory so far (VmHWM), in MB.
peak_rss_mb() {
    awk '/^VmHWM:/ { printf "%.1f", $2 / 1024 }' "/proc/$SERVER/status"
}

# redis_server PORT [ARGS…]: a redis-server on 127.0.0.1:PORT pinned to CPU 1 (the
# client's), keeping nothing on disk, its files in WORK/PORT; stopped on exit. Waited
# for until it answers.
redis_server() {
    local port=$1
    shift
    mkdir -p "$WORK/$port"
    (cd "$WORK/$port" && exec taskset -c 1 redis-server --bind 127.0.0.1 --port "$port" \
        --save "" --appendonly no --daemonize no --logfile "$WORK/$port/log" "$@") &
    STARTED+=($!)
    for _ in $(seq 50); do
        redis-cli -p "$port" ping >/dev/null 2>&1 && return
        sleep 0.1
    done
    echo "redis-server on $port did not start" >&2
    exit 1
}
