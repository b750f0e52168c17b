#!/usr/bin/env bash
# ValidateToken and Login QPS with an EdDSA ring against an HS256 ring, in one run on
# one machine: a release authd pinned to one core (taskset -c "$SERVER_CPU", one hash
# thread), authbench pinned to another, a fresh SQLite file per ring.
#
#   bench/token-algorithms.sh            # BENCH_DURATION=10 BENCH_WARMUP=3 by default
#
# Login runs at two PBKDF2 costs: 10,000 rounds (the hash dominates) and 1,000 (the
# lowest authd allows, where the token's signature is a visible part of the work).
set -euo pipefail
cd "$(dirname "$0")/.."
SERVER_CPU=${SERVER_CPU:-1}
CLIENT_CPU=${CLIENT_CPU:-0}
DURATION=${BENCH_DURATION:-10}
WARMUP=${BENCH_WARMUP:-3}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build --release -q -p authd -p authbench
AUTHD="$TARGET_DIR/release/authd"
AUTHBENCH="$TARGET_DIR/release/authbench"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

HS256="hs:$(head -c 32 /dev/urandom | base64 -w0)"
EDDSA="$("$AUTHD" keygen --alg ed25519 --kid ed)"

run() { # ring-name keys iterations scenario
  local name=$1 keys=$2 iterations=$3 scenario=$4 db="$WORK/$1-$3-$4.db"
  printf '%s\n' "$keys" > "$WORK/keys"
  # authbench registers its users from one address: no limit on Register.
  AUTHD_TOKEN_KEYS_FILE="$WORK/keys" AUTHD_DATABASE_URL="sqlite://$db" AUTHD_REGISTER_LIMIT=off \
    AUTHD_LISTEN=127.0.0.1:50061 AUTHD_METRICS_LISTEN=127.0.0.1:0 \
    AUTHD_HEALTH_LISTEN=127.0.0.1:0 AUTHD_HASH_THREADS=1 \
    AUTHD_PBKDF2_ITERATIONS="$iterations" AUTHD_LOG=warn \
    taskset -c "$SERVER_CPU" "$AUTHD" &
  local pid=$!
  local qps
  qps=$(taskset -c "$CLIENT_CPU" "$AUTHBENCH" "$scenario" --target http://127.0.0.1:50061 \
    --wait 30s -c 64 --users 20 --warmup "${WARMUP}s" --duration "${DURATION}s" --json |
    python3 -c 'import json,sys; r=json.load(sys.stdin); print("%.0f %.2f" % (r["ok_qps"], r["ok_latency_ms"]["p99"] if r["ok_latency_ms"] else 0))')
  kill -TERM "$pid"; wait "$pid" || true
  echo "| $scenario | $name | $iterations | ${qps% *} | ${qps#* } |"
}

echo "| scenario | ring | PBKDF2 rounds | QPS (successful) | p99 (ms) |"
echo "|---|---|---:|---:|---:|"
for scenario in validate login; do
  for iterations in 10000 1000; do
    [ "$scenario" = validate ] && [ "$iterations" = 1000 ] && continue
    run HS256 "$HS256" "$iterations" "$scenario"
    run EdDSA "$EDDSA" "$iterations" "$scenario"
  done
done
