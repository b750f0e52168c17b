#!/usr/bin/env bash
# bench/suite.sh: the whole benchmark suite in one run, on one build and one machine:
# bench/seed-table.sh (bench/RESULTS.md: the original load test's table, overload,
# the report's service, the hash engines), then bench/sizing.sh (docs/sizing.md: the
# sizing guide's figures). Each page names the revision, the machine and the time it
# was measured at; this script runs them back to back, so both describe one build.
#
#   bench/suite.sh                 # both pages, with the scripts' own settings
#   BENCH_BASELINE_AUTHD=<authd of another revision> bench/suite.sh
#
# Takes about 40 minutes on a 2-core machine. Environment: as each script documents
# (BENCH_DURATION and BENCH_WARMUP apply to both when set).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
bash bench/seed-table.sh
bash bench/sizing.sh
echo "bench/RESULTS.md and docs/sizing.md measured from $started to $(date -u +%Y-%m-%dT%H:%M:%SZ) at $(git rev-parse --short HEAD)" >&2
