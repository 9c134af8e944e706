#!/usr/bin/env bash
# Where an RLQS report's server CPU goes, by stage: runs the rlqs_report bench (10,000
# buckets a report, one stream, real Redis) against the server binary BIN (default: this
# tree's release build), samples the server with perf for a few seconds of steady reports,
# and attributes each sample to the innermost stage on its stack (scripts/rlqs_stages.py).
#
#   scripts/rlqs-profile.sh [BIN]       (perf and redis-server on the PATH)
#
# BACKENDS=memory profiles the memory backend instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-$PWD/target/release/floodgate}
work=$(mktemp -d)
bench=
trap 'kill "$bench" 2>/dev/null || true; rm -rf "$work"' EXIT
cargo build --release --benches --quiet
bench_bin=$(ls -t target/release/deps/rlqs_report-* | grep -v '\.d$' | head -1)
backend=${BACKENDS:-redis}
reports=150
[[ $backend == memory ]] && reports=800
SERVER_BIN=$bin THIS_TREE=0 REPORTS=$reports BACKENDS=$backend "$bench_bin" > "$work/bench.txt" 2>&1 &
bench=$!
sleep 4
pid=$(pgrep -f -n "serve .*--backend $backend")
perf record -q -F 999 --call-graph dwarf,32768 -p "$pid" -o "$work/perf.data" -- sleep 6 > /dev/null 2>&1
perf script -i "$work/perf.data" 2> /dev/null | python3 scripts/rlqs_stages.py
