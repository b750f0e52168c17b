#!/usr/bin/env bash
# bench/tls-cost.sh: what TLS costs. Starts two release authd servers pinned to the
# same core (core 0 on a 2-core machine, one hash thread each), one plaintext and one
# with mutual TLS (a CA and certificates made here with openssl), and runs the same
# authbench scenarios against each, alternately, in the same run: ValidateToken and
# Login (at BENCH_ITERATIONS PBKDF2 iterations, low by default so that the transport
# shows and not the hash), on long-lived connections. Prints one JSON object per run.
#
# New connections per request are not measured here: authbench keeps its connections
# open. The handshake's cost alone (TLS 1.3, ECDSA P-256) is what `openssl s_time`
# reports against the TLS port, printed last.
#
# Usage: bench/tls-cost.sh
# Environment (defaults in brackets):
#   BENCH_DURATION    measured seconds per run [10]
#   BENCH_WARMUP      warm-up seconds per run [3]
#   BENCH_CONCURRENCY authbench's requests in flight [50]
#   BENCH_ITERATIONS  PBKDF2 iterations of the servers (Login's cost) [1000]
# Needs: cargo, taskset, openssl, python3.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${BENCH_DURATION:-10}
WARMUP=${BENCH_WARMUP:-3}
CONCURRENCY=${BENCH_CONCURRENCY:-50}
ITERATIONS=${BENCH_ITERATIONS:-1000}
for tool in cargo taskset openssl python3; do
    command -v "$tool" >/dev/null || { echo "tls-cost.sh: needs $tool" >&2; exit 1; }
done
cargo build --release --locked --bins >&2
TARGET_DIR=${CARGO_TARGET_DIR:-target}
AUTHD=$TARGET_DIR/release/authd
AUTHBENCH=$TARGET_DIR/release/authbench
work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# A CA, a server certificate for localhost, a client certificate.
ec() { openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "$@" 2>/dev/null; }
ec -x509 -days 2 -subj /CN=bench-ca -keyout "$work/ca.key" -out "$work/ca.pem"
for who in server client; do
    san=DNS:localhost,IP:127.0.0.1
    [[ $who == client ]] && san=URI:spiffe://bench/client
    ec -subj "/CN=$who" -addext "subjectAltName=$san" -keyout "$work/$who.key" -out "$work/$who.csr"
    openssl x509 -req -in "$work/$who.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" \
        -days 2 -copy_extensions copy -out "$work/$who.pem" 2>/dev/null
done

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
keys="bench:$(head -c 32 /dev/urandom | base64)"
start() { # NAME PORT [ENV…]
    local name=$1 port=$2
    shift 2
    # Each authbench run registers its users from one address: no limit on Register.
    env "$@" AUTHD_LISTEN="127.0.0.1:$port" AUTHD_HEALTH_LISTEN="" AUTHD_METRICS_LISTEN="" \
        AUTHD_DATABASE_URL="sqlite://$work/$name.db" AUTHD_PBKDF2_ITERATIONS="$ITERATIONS" \
        AUTHD_HASH_THREADS=1 AUTHD_TOKEN_KEYS="$keys" AUTHD_REGISTER_LIMIT=off AUTHD_LOG=warn \
        taskset -c 0 "$AUTHD" >"$work/$name.log" 2>&1 &
    pids+=($!)
}
plain_port=$(free_port)
tls_port=$(free_port)
start plain "$plain_port"
start tls "$tls_port" AUTHD_TLS_CERT="$work/server.pem" AUTHD_TLS_KEY="$work/server.key" \
    AUTHD_TLS_CLIENT_CA="$work/ca.pem"

bench() { # SCENARIO TARGET [OPTIONS…]
    local scenario=$1 target=$2
    shift 2
    taskset -c 1 "$AUTHBENCH" "$scenario" --target "$target" --wait 30s --json \
        --concurrency "$CONCURRENCY" --duration "${DURATION}s" --warmup "${WARMUP}s" "$@"
}
tls=(--tls-ca "$work/ca.pem" --tls-cert "$work/client.pem" --tls-key "$work/client.key"
    --tls-server-name localhost)
for scenario in validate login; do
    for round in 1 2; do
        echo "{\"round\":$round,\"transport\":\"plaintext\",\"report\":$(bench "$scenario" "http://127.0.0.1:$plain_port")}"
        echo "{\"round\":$round,\"transport\":\"mutual-tls\",\"report\":$(bench "$scenario" "https://127.0.0.1:$tls_port" "${tls[@]}")}"
    done
done

# Full handshakes per second against the TLS port (no resumption), from core 1.
taskset -c 1 openssl s_time -connect "127.0.0.1:$tls_port" -new -time 5 \
    -CAfile "$work/ca.pem" -cert "$work/client.pem" -key "$work/client.key" 2>/dev/null |
    grep -E 'connections in [0-9.]+s' || true
