#!/usr/bin/env bash
# External authorization, measured in one run on one machine: a release authd pinned
# to one core, its clients on another, a fresh SQLite file per server.
#
#   bench/mesh.sh            # BENCH_DURATION=8 BENCH_WARMUP=2 by default
#
# 1. Envoy's Check against ValidateToken, closed loop (-c 64), with an HS256 and an
#    EdDSA ring: decisions per second and their ratio (the target: Check within 20%),
#    three alternated pairs against one server: the medians, and the median ratio.
# 2. Check in open loop at half the rate it reached, over one connection: its p99
#    (the target: <= 1 ms), three runs, their median and range; beside it authd's
#    own p99 and how late the client sent at p99. The host can take a core away for
#    several milliseconds a few times in ten seconds; at tens of thousands of
#    requests a second a few such pauses alone make a 1 % tail, so one run's p99
#    says as much about the host as about authd.
# 3. nginx auth_request in front of an upstream (nginx itself answering 200), against
#    the same nginx proxying the same upstream without it: wrk's latency, so the
#    difference is what the forward-auth round trip adds (needs nginx and wrk, Debian's
#    nginx-light and wrk; skipped without them).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${BENCH_DURATION:-8}
WARMUP=${BENCH_WARMUP:-2}
ITERATIONS=1000
# shellcheck source=bench/lib.sh
source bench/lib.sh

HS_SECRET=$(head -c 32 /dev/urandom | base64 -w0)
HS256="hs:hs256:$HS_SECRET"
EDDSA="$("$AUTHD" keygen --alg ed25519 --kid ed)"

# run SCENARIO [authbench options…]: "qps p99_ms late_p99_ms" against the server
# started last (late: how late an open loop's client sent, at p99; 0 in a closed loop).
run() {
  local scenario=$1
  shift
  taskset -c 1 "$AUTHBENCH" "$scenario" --target "http://127.0.0.1:$PORT" \
    --users 20 --warmup "${WARMUP}s" --duration "${DURATION}s" --json "$@" |
    python3 -c 'import json,sys; r=json.load(sys.stdin); l=r["ok_latency_ms"] or {}; s=r.get("send_late_ms") or {}; print("%.0f %.3f %.3f" % (r["ok_qps"], l.get("p99", 0), s.get("p99", 0)))'
}

# check_buckets: authd's own histogram of Check durations (cumulative counts by
# bucket), scraped from the metrics port of the server started last.
check_buckets() {
  curl -s "http://127.0.0.1:$METRICS_PORT/metrics" |
    grep '^authd_grpc_request_duration_seconds_bucket{.*method="Check"' || true
}

# server_p99 BEFORE AFTER: the smallest bucket bound (ms) of that histogram holding
# 99 % of the Checks answered between the two scrapes: the server's own p99, from a
# request's arrival at the handler to its answer.
server_p99() {
  python3 - "$1" "$2" <<'PY'
import re, sys
def counts(text):
    c = {}
    for line in text.splitlines():
        le, n = re.search(r'le="([^"]+)"\} (\S+)', line).groups()
        c[float(le)] = c.get(float(le), 0) + float(n)
    return c
before, after = counts(sys.argv[1]), counts(sys.argv[2])
total = after[float("inf")] - before.get(float("inf"), 0)
for le in sorted(after):
    if after[le] - before.get(le, 0) >= 0.99 * total:
        print("%g" % (le * 1000))
        break
PY
}

echo "| ring | ValidateToken/s | Check/s | Check / ValidateToken, median of 3 pairs (range) | Check p99 at half that rate, median of 3 (range), ms | the server's own p99 then, ms | the client's send lateness p99 then, ms |"
echo "|---|---:|---:|---:|---:|---:|---:|"
median='import sys; v=sorted(map(float, sys.argv[2:])); print(sys.argv[1] % (v[1], v[0], v[2]))'
middle='import sys; print("%.0f" % sorted(map(float, sys.argv[1:]))[1])'
for ring in HS256 EdDSA; do
  keys=$HS256
  [ "$ring" = EdDSA ] && keys=$EDDSA
  METRICS_PORT=$(free_port)
  start_pinned "$AUTHD" "sqlite://$WORK/mesh-$ring.db" AUTHD_TOKEN_KEYS="$keys" \
    AUTHD_METRICS_LISTEN="127.0.0.1:$METRICS_PORT"
  # Three pairs, ValidateToken then Check, against the same server: on a shared host
  # the rate drifts by more than the difference between the two calls, so each ratio
  # is taken within its pair and the median of the three is reported.
  validates=()
  checks=()
  ratios=()
  for _ in 1 2 3; do
    out=$(run validate -c 64)
    read -r validate _ <<<"$out"
    out=$(run check -c 64)
    read -r check _ <<<"$out"
    validates+=("$validate")
    checks+=("$check")
    ratios+=("$(python3 -c "print($check / $validate)")")
  done
  validate=$(python3 -c "$middle" "${validates[@]}")
  check=$(python3 -c "$middle" "${checks[@]}")
  ratio=$(python3 -c "$median" "%.2f× (%.2f–%.2f)" "${ratios[@]}")
  half=$(( check / 2 ))
  # One connection, as the closed loop above used and as an Envoy worker multiplexes
  # its Check calls (authbench's open-loop default opens one per 200 requests/s).
  p99s=()
  owns=()
  lates=()
  for _ in 1 2 3; do
    before=$(check_buckets)
    out=$(run check --rate "$half" --connections 1)
    read -r _ open_p99 open_late <<<"$out"
    p99s+=("$open_p99")
    lates+=("$open_late")
    owns+=("$(server_p99 "$before" "$(check_buckets)")")
  done
  stop
  p99=$(python3 -c "$median" "%.3f (%.3f–%.3f)" "${p99s[@]}")
  own=$(python3 -c "$median" "≤ %g (%g–%g)" "${owns[@]}")
  late=$(python3 -c "$median" "%.3f (%.3f–%.3f)" "${lates[@]}")
  echo "| $ring | $validate | $check | $ratio | $p99 at $half/s | $own | $late |"
done

if ! command -v nginx >/dev/null && ! [ -x /usr/sbin/nginx ] || ! command -v wrk >/dev/null; then
  echo
  echo "nginx or wrk missing (apt-get install nginx-light wrk): the nginx rows are skipped"
  exit 0
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

# A token authd verifies: HS256 under the ring's key, minted here.
TOKEN=$(HS_SECRET="$HS_SECRET" python3 - <<'PY'
import base64, hmac, hashlib, json, os, time
b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
now = int(time.time())
header = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "hs"}).encode())
claims = b64(json.dumps({"sub": "u-1", "name": "bench", "iss": "authd", "iat": now,
                         "exp": now + 3600, "amr": ["pwd"]}).encode())
key = base64.b64decode(os.environ["HS_SECRET"])
mac = hmac.new(key, f"{header}.{claims}".encode(), hashlib.sha256).digest()
print(f"{header}.{claims}.{b64(mac)}")
PY
)
FORWARD_PORT=$(free_port)
NGINX_PORT=$(free_port)
APP_PORT=$(free_port)
start_pinned "$AUTHD" "sqlite://$WORK/forward.db" AUTHD_TOKEN_KEYS="$HS256" \
  AUTHD_FORWARD_AUTH_LISTEN="127.0.0.1:$FORWARD_PORT"
cp deploy/nginx/authd-identity.conf "$WORK/identity.conf"
mkdir -p "$WORK/nginx"
cat > "$WORK/nginx.conf" <<EOF
daemon off;
worker_processes 1;
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $WORK/nginx/body;
    proxy_temp_path $WORK/nginx/proxy;
    fastcgi_temp_path $WORK/nginx/fastcgi;
    uwsgi_temp_path $WORK/nginx/uwsgi;
    scgi_temp_path $WORK/nginx/scgi;
    upstream authd { server 127.0.0.1:$FORWARD_PORT; keepalive 32; }
    upstream app { server 127.0.0.1:$APP_PORT; keepalive 32; }
    server {
        listen 127.0.0.1:$APP_PORT;
        location / { return 200 "ok\n"; }
    }
    server {
        listen 127.0.0.1:$NGINX_PORT;
        location = /_authd {
            internal;
            proxy_pass http://authd/forward-auth;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
        location /alone/ {
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
        location / {
            auth_request /_authd;
            include $WORK/identity.conf;
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
EOF
taskset -c 1 "$NGINX" -c "$WORK/nginx.conf" -e "$WORK/nginx-error.log" &
STARTED+=($!)
for _ in $(seq 50); do
  curl -s -o /dev/null "http://127.0.0.1:$NGINX_PORT/alone/" && break
  sleep 0.1
done
status=$(curl -s -o /dev/null -w '%{http_code}' -H "authorization: Bearer $TOKEN" "http://127.0.0.1:$NGINX_PORT/app")
[ "$status" = 200 ] || { echo "nginx with auth_request answered $status to a valid token"; exit 1; }

wrk_row() { # name path
  local out
  out=$(taskset -c 1 wrk -t1 -c16 -d"${DURATION}s" --latency \
    -H "authorization: Bearer $TOKEN" "http://127.0.0.1:$NGINX_PORT$2")
  python3 - "$1" "$out" <<'PY'
import re, sys
name, out = sys.argv[1], sys.argv[2]
def ms(v):
    n, unit = re.match(r"([\d.]+)(us|ms|s)", v).groups()
    return float(n) * {"us": 0.001, "ms": 1, "s": 1000}[unit]
# The distribution's own lines only: a "+/- Stdev" column above may end in "50%".
p50 = ms(re.search(r"^\s*50%\s+(\S+)", out, re.M).group(1))
p99 = ms(re.search(r"^\s*99%\s+(\S+)", out, re.M).group(1))
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
print(f"| {name} | {rps:.0f} | {p50:.3f} | {p99:.3f} | {non2xx.group(1) if non2xx else 0} |")
PY
}
echo
echo "nginx (one worker, on the client's core) in front of an upstream answering 200; wrk -t1 -c16:"
echo
echo "| path | requests/s | p50 (ms) | p99 (ms) | not 2xx |"
echo "|---|---:|---:|---:|---:|"
wrk_row "nginx alone" /alone/
wrk_row "nginx + auth_request to authd" /app
