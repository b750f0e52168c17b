#!/usr/bin/env bash
# The rate-limit tier on one Redis against a Redis Cluster of three primaries, in one
# run on one machine: a release authd pinned to one core, authbench and the Redis
# servers on another, every server on 127.0.0.1 ports of its own (started here, stopped
# at the end, by bench/lib.sh; needs redis-server and redis-cli).
#
#   bench/ratelimit-redis.sh            # BENCH_DURATION=8 BENCH_WARMUP=2 by default
#
# Rows: Envoy's ShouldRateLimit (one descriptor, 1,000 keys, a limit never reached, so
# every decision is a full round trip that adds an entry), in process, on one Redis
# and on the cluster; Login (1,000 PBKDF2 rounds, the login throttle on) on one Redis
# and on the cluster, where every Login reads and clears its throttle entries there.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${BENCH_DURATION:-8}
WARMUP=${BENCH_WARMUP:-2}
ITERATIONS=1000
# shellcheck source=bench/lib.sh
source bench/lib.sh
SINGLE=$(free_port)
redis_server "$SINGLE"
NODES=()
for _ in 1 2 3; do
  # A cluster node also listens on its port + 10,000 (the cluster bus).
  port=$(free_port)
  while ((port > 55535)); do port=$(free_port); done
  redis_server "$port" --cluster-enabled yes --cluster-config-file "nodes-$port.conf"
  NODES+=("127.0.0.1:$port")
done
redis-cli --cluster create "${NODES[@]}" --cluster-replicas 0 --cluster-yes >/dev/null
for _ in $(seq 100); do
  redis-cli -p "${NODES[0]#*:}" cluster info | grep -q cluster_state:ok && break
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
  local name=$1 scenario=$2 url=$3 row
  redis-cli -p "$SINGLE" flushall >/dev/null
  start_pinned "$AUTHD" "sqlite://$WORK/$name-$scenario.db" \
    AUTHD_RATE_LIMIT_RULES_FILE="$WORK/rules.yaml" ${url:+AUTHD_REDIS_URL=$url}
  row=$(taskset -c 1 "$AUTHBENCH" "$scenario" --target "http://127.0.0.1:$PORT" \
    -c 50 --users 100 --keys 1000 --warmup "${WARMUP}s" --duration "${DURATION}s" --json |
    python3 -c 'import json,sys; r=json.load(sys.stdin); l=r["ok_latency_ms"] or {}; print("%.0f | %.2f | %.2f" % (r["ok_qps"], l.get("p50",0), l.get("p99",0)))')
  stop
  echo "| $scenario | $name | $row |"
}

echo "| scenario | store | decisions or logins/s | p50 (ms) | p99 (ms) |"
echo "|---|---|---:|---:|---:|"
run "in process" ratelimit ""
run "one Redis" ratelimit "redis://127.0.0.1:$SINGLE"
run "Redis Cluster, 3 primaries" ratelimit "$CLUSTER"
run "one Redis" login "redis://127.0.0.1:$SINGLE"
run "Redis Cluster, 3 primaries" login "$CLUSTER"
