#!/usr/bin/env bash
# End-to-end smoke test of three authd replicas on this machine's PostgreSQL and
# Redis, started by scripts/replicas.sh from the release binaries (with --debug,
# from the dev profile's, which `cargo test` has already built: what CI runs):
#
#   1. `authd health` reports SERVING on every replica (and names what is wrong on
#      a closed port and for an unknown service);
#   2. examples/smoke.rs registers through replica 1, logs in through replica 2,
#      validates the token on replica 3, then sends logins round robin over all
#      three under the rule Login:global=LIMIT/1m: the logins admitted by the three
#      together must add up to exactly LIMIT (the limit is global, kept in Redis);
#   3. the replicas stop gracefully (exit 0) on SIGTERM.
#
# Everything it makes is removed on exit, whatever happens: the processes it started,
# the PostgreSQL schema, the Redis keys (under a prefix of its own) and its temp dir.
#
#   scripts/smoke-replicas.sh [--postgres URL] [--redis URL] [--base-port PORT] [--debug]
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
postgres_url="${AUTHD_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"
redis_url="${AUTHD_TEST_REDIS_URL:-redis://127.0.0.1:6379}"
base_port=""
profile=release
limit=12
logins=30

while [[ $# -gt 0 ]]; do
    case "$1" in
        --postgres) postgres_url="$2"; shift 2 ;;
        --redis) redis_url="$2"; shift 2 ;;
        --base-port) base_port="$2"; shift 2 ;;
        --debug) profile=debug; shift ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "smoke-replicas.sh: unknown argument: $1" >&2; exit 2 ;;
    esac
done

step() { printf -- '--- %s\n' "$*"; }
fail() { echo "smoke-replicas.sh: FAILED: $*" >&2; exit 1; }

# Only what this script sets reaches the replicas.
while IFS= read -r var; do
    unset "$var"
done < <(compgen -e | grep '^AUTHD_' | grep -v '^AUTHD_TEST_' || true)

step "build ($profile): authd and examples/smoke.rs"
build=(cargo build --locked --bin authd --example smoke)
[[ $profile == debug ]] || build+=(--release)
(cd "$root" && "${build[@]}")
target_dir="${CARGO_TARGET_DIR:-$root/target}"
authd="$target_dir/$profile/authd"
smoke="$target_dir/$profile/examples/smoke"

run_id="$$_$(date +%s)_$RANDOM"
schema="authd_smoke_$run_id"
prefix="authd-smoke:$run_id"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/authd-smoke.XXXXXX")"
replicas_pid=""
schema_created=0

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    if [[ -n "$replicas_pid" ]] && kill -0 "$replicas_pid" 2>/dev/null; then
        kill -TERM "$replicas_pid" 2>/dev/null || true
        wait "$replicas_pid" 2>/dev/null || true
    fi
    # Belt and braces: any replica replicas.sh did not reap (it removes its pid files
    # once they are gone).
    local f pid
    for f in "$tmp"/logs/replica-*.pid; do
        [[ -e "$f" ]] || continue
        pid="$(cat "$f")"
        kill -KILL "$pid" 2>/dev/null || true
    done
    if (( schema_created )); then
        PGOPTIONS='-c client_min_messages=warning' \
            psql -q -X "$postgres_url" -c "DROP SCHEMA IF EXISTS \"$schema\" CASCADE" >/dev/null \
            || echo "warning: could not drop schema $schema" >&2
    fi
    redis-cli -u "$redis_url" --scan --pattern "$prefix*" 2>/dev/null \
        | xargs -r redis-cli -u "$redis_url" del >/dev/null 2>&1 || true
    if (( status != 0 )) && [[ -d "$tmp/logs" ]]; then
        echo "--- replica logs (last lines)" >&2
        tail -n 15 "$tmp"/logs/*.log >&2 || true
    fi
    rm -rf "$tmp"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step "services"
psql -q -X "$postgres_url" -c "select 1" >/dev/null || fail "PostgreSQL does not answer at $postgres_url"
redis-cli -u "$redis_url" ping >/dev/null || fail "Redis does not answer at $redis_url"
psql -q -X "$postgres_url" -c "CREATE SCHEMA \"$schema\"" >/dev/null
schema_created=1
sep='?'; [[ "$postgres_url" == *\?* ]] && sep='&'
database_url="$postgres_url${sep}options[search_path]=$schema"
echo "PostgreSQL schema $schema, Redis key prefix $prefix"

# Three consecutive free ports, below the kernel's ephemeral range: a port in it may
# be taken between the check and the bind as the local port of an outgoing
# connection (the first replicas' own connections to PostgreSQL and Redis), and no
# check sees those; below it, only a listener holds a port.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
read -r ephemeral _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || ephemeral=32768
(( ephemeral > 10100 )) || fail "the ephemeral port range starts at $ephemeral: give --base-port"
if [[ -z "$base_port" ]]; then
    for _ in $(seq 1 50); do
        candidate=$(( 10000 + RANDOM % (ephemeral - 10003) ))
        if port_free "$candidate" && port_free $((candidate + 1)) && port_free $((candidate + 2)); then
            base_port=$candidate
            break
        fi
    done
    [[ -n "$base_port" ]] || fail "found no three free consecutive ports"
fi
addrs=("127.0.0.1:$base_port" "127.0.0.1:$((base_port + 1))" "127.0.0.1:$((base_port + 2))")

step "start 3 replicas (scripts/replicas.sh)"
# Cheap hashes: this checks behaviour, not cost.
export AUTHD_PBKDF2_ITERATIONS=1000
export AUTHD_RATE_LIMITS="Login:global=$limit/1m"
export AUTHD_RATE_LIMIT_PREFIX="$prefix"
export AUTHD_RATE_LIMIT_FAILURE=open
# The smoke client counts rate-limit refusals as they come, with its own timeout and
# no gRPC deadline: refusals are answered at once, not held.
export AUTHD_REFUSAL_HOLD=0s
export AUTHD_DRAIN_TIMEOUT=5s
export AUTHD_LOG=info
"$root/scripts/replicas.sh" -n 3 --base-port "$base_port" --bin "$authd" \
    --database-url "$database_url" --redis-url "$redis_url" \
    --log-dir "$tmp/logs" --ready-timeout 60 >"$tmp/replicas.out" 2>&1 &
replicas_pid=$!
deadline=$(( SECONDS + 90 ))
until grep -q "replicas are SERVING" "$tmp/replicas.out" 2>/dev/null; do
    if ! kill -0 "$replicas_pid" 2>/dev/null; then
        cat "$tmp/replicas.out" >&2
        fail "scripts/replicas.sh exited before the replicas were SERVING"
    fi
    (( SECONDS < deadline )) || fail "the replicas were not SERVING after 90s"
    sleep 0.2
done
sed 's/^/  /' "$tmp/replicas.out"

step "authd health on each replica"
for addr in "${addrs[@]}"; do
    "$authd" health --addr "$addr" || fail "authd health $addr"
    "$authd" health --addr "$addr" --service auth.v1.AuthService || fail "authd health $addr auth.v1.AuthService"
done

step "authd health names what is wrong (non-zero exit, one line)"
expect_unhealthy() {
    local want="$1" out rc=0
    shift
    out="$("$authd" health "$@" 2>&1)" || rc=$?
    (( rc != 0 )) || fail "authd health $* exited 0: $out"
    [[ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ]] || fail "authd health $* printed more than one line: $out"
    [[ "$out" == *"$want"* ]] || fail "authd health $*: expected '$want' in: $out"
    echo "  exit $rc: $out"
}
expect_unhealthy SERVICE_UNKNOWN --addr "${addrs[0]}" --service no.such.Service
closed=$(( base_port + 3 ))
port_free "$closed" && expect_unhealthy unreachable --addr "127.0.0.1:$closed"

step "register on 1, log in on 2, validate on 3, then Login:global=$limit/1m across the three"
"$smoke" --replicas "$(IFS=,; echo "${addrs[*]}")" --logins "$logins" --expect-admitted "$limit"

step "stop the replicas (SIGTERM: drain, exit 0)"
kill -TERM "$replicas_pid"
rc=0
wait "$replicas_pid" || rc=$?
replicas_pid=""
tail -n 2 "$tmp/replicas.out" | sed 's/^/  /'
(( rc == 0 )) || fail "scripts/replicas.sh exited with status $rc"
for addr in "${addrs[@]}"; do
    port_free "${addr##*:}" || fail "something still listens on $addr"
done
for f in "$tmp"/logs/replica-*.pid; do
    [[ -e "$f" ]] && fail "a replica was not reaped: $f"
done
echo "smoke-replicas: passed"
