#!/usr/bin/env bash
# bench/login-timing.sh: whether a failed login's latency tells a known username
# from an unknown one (examples/login_timing.rs), after the stored hashes' cost was
# raised and after it was lowered: the accuracy of the best latency threshold
# (about 0.5 is chance; it fails above BENCH_MAX_ACCURACY).
#
# Usage: bench/login-timing.sh
# Environment: BENCH_SAMPLES [100], BENCH_MAX_ACCURACY [0.70].
# Prints a Markdown table on stdout.
set -euo pipefail

SAMPLES=${BENCH_SAMPLES:-100}
MAX_ACCURACY=${BENCH_MAX_ACCURACY:-0.70}

cd "$(dirname "$0")/.."
cargo build --release --locked --example login_timing >&2
BIN=${CARGO_TARGET_DIR:-target}/release/examples/login_timing

echo "CPU: $(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo), $(nproc) cores"
echo
"$BIN" --samples "$SAMPLES" --max-accuracy "$MAX_ACCURACY"
