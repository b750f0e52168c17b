#!/usr/bin/env bash
# The rate-limit tier on one Redis against a Redis Cluster of three primaries, in one
# run on one machine: a release authd pinned to one core, authbench and the Redis
# servers on another, every server on 127.0.0.1 ports of its own (started here, stopped
# at the end; needs redis-server and redis-cli).
#
#   bench/ratelimit-redis.sh            # BENCH_DURATION=8 BENCH_WARMUP=2 by default
#
# Rows: Envoy's ShouldRateLimit (one descriptor, 1,000 keys, a limit never reached, so
# every decision is a full round trip that adds an entry), in process, on one Redis
# and on the cluster; Login (1,000 PBKDF2 rounds, the login throttle on) on one Redis
# and on the cluster, where every Login reads and clears its throttle entries there.
set -euo pipefail
cd "$(dirname "$0")/.."
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
DURATION=${BENCH_DURATION:-8}
WARMUP=${BENCH_WARMUP:-2}
BASE_PORT=${BENCH_REDIS_PORT:-7301}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build --release -q -p authd -p authbench
AUTHD="$TARGET_DIR/release/authd"
AUTHBENCH="$TARGET_DIR/release/authbench"
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

redis() { # port [args...]
  local port=$1
  shift
  mkdir -p "$WORK/$port"
  (cd "$WORK/$port" && taskset -c "$CLIENT_CPU" redis-server --bind 127.0.0.1 --port "$port" \
    --save "" --appendonly no --daemonize no --logfile "$WORK/$port/log" "$@") &
  PIDS+=($!)
  for _ in $(seq 50); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && return
    sleep 0.1
  done
  echo "redis-server on $port did not start" >&2
  exit 1
}

SINGLE=$BASE_PORT
redis "$SINGLE"
NODES=()
for i in 1 2 3; do
  port=$((BASE_PORT + i))
  redis "$port" --cluster-enabled yes --cluster-config-file "nodes-$port.conf"
  NODES+=("127.0.0.1:$port")
done
redis-cli --cluster create "${NODES[@]}" --cluster-replicas 0 --cluster-yes >/dev/null
for _ in $(seq 100); do
  redis-cli -p $((BASE_PORT + 1)) cluster info | grep -q cluster_state:ok && break
  sleep 0.1
done
CLUSTER="redis+cluster://$(IFS=,; echo "${NODES[*]}")"

cat > "$WORK/rules.yaml" <<'EOF'
domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: minute, requests_per_unit: 1000000 }
EOF

run() { # name scenario redis-url
  local name=$1 scenario=$2 url=$3 db="$WORK/$1-$2.db"
  redis-cli -p "$SINGLE" flushall >/dev/null
  env AUTHD_DATABASE_URL="sqlite://$db" AUTHD_REGISTER_LIMIT=off \
    AUTHD_RATE_LIMIT_RULES_FILE="$WORK/rules.yaml" ${url:+AUTHD_REDIS_URL=$url} \
    AUTHD_LISTEN=127.0.0.1:50081 AUTHD_METRICS_LISTEN=127.0.0.1:0 \
    AUTHD_HEALTH_LISTEN=127.0.0.1:0 AUTHD_HASH_THREADS=1 AUTHD_PBKDF2_ITERATIONS=1000 \
    AUTHD_LOG=warn taskset -c "$SERVER_CPU" "$AUTHD" 2>>"$WORK/authd.log" &
  local pid=$!
  local row
  row=$(taskset -c "$CLIENT_CPU" "$AUTHBENCH" "$scenario" --target http://127.0.0.1:50081 \
    --wait 30s -c 50 --users 100 --keys 1000 --warmup "${WARMUP}s" --duration "${DURATION}s" --json |
    python3 -c 'import json,sys; r=json.load(sys.stdin); l=r["ok_latency_ms"] or {}; print("%.0f | %.2f | %.2f" % (r["ok_qps"], l.get("p50",0), l.get("p99",0)))')
  kill -TERM "$pid"
  wait "$pid" || true
  echo "| $scenario | $name | $row |"
}

echo "| scenario | store | decisions or logins/s | p50 (ms) | p99 (ms) |"
echo "|---|---|---:|---:|---:|"
run "in process" ratelimit ""
run "one Redis" ratelimit "redis://127.0.0.1:$SINGLE"
run "Redis Cluster, 3 primaries" ratelimit "$CLUSTER"
run "one Redis" login "redis://127.0.0.1:$SINGLE"
run "Redis Cluster, 3 primaries" login "$CLUSTER"
