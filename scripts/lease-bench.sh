#!/usr/bin/env bash
# One hot counter (a limit the load never reaches), three ways, in one run: the memory
# backend, Redis hit by hit, and Redis with `lease: true` (docs/algorithms.md, "Leases"),
# each ROUNDS (2) times in turn, one server binary, one load generator.
#   scripts/lease-bench.sh [BIN] [-- floodgate-bench flags]
#   scripts/lease-bench.sh target/release/floodgate -- --concurrency 256 --connections 16
# Rows as `scripts/compare.sh` prints them (decided/s, latencies, CPU µs per decision of the
# server, Redis and the load generator, Redis commands per decision), each after its mode.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release/floodgate
if [ $# -gt 0 ] && [ "$1" != "--" ]; then
    bin=$1
    shift
fi
[ $# -gt 0 ] && shift
for round in $(seq "${ROUNDS:-2}"); do
    for mode in "memory hot" "redis hot" "redis leased"; do
        set -- $mode "$@"
        backend=$1 key=$2
        shift 2
        echo "# round $round: $backend, key $key"
        scripts/compare.sh "$backend" "$bin" -- --key "$key" --keys 1 "$@"
    done
done
