#!/usr/bin/env bash
# Several server binaries under one load, one after the other against one redis-server, with
# one load generator: the README's before/after rows (ratios are only worth comparing within
# one run of this script).
#   scripts/compare.sh BACKEND BIN [BIN…] [-- floodgate bench flags]
#   scripts/compare.sh redis /tmp/floodgate-before target/release/floodgate -- --concurrency 256 --connections 16
# BACKEND is memory or redis. Each row: the binary, then `floodgate bench --format tsv`'s
# columns (decided/s, shed/s, unavailable/s, p50/p99/p999, CPU µs per decision of server,
# Redis and load generator, Redis commands per decision). DURATION (6) and WARMUP (2) set
# each run's length; PORT_BASE (18000) and REDIS_PORT (16379) its ports.
set -euo pipefail
cd "$(dirname "$0")/.."
backend=$1
shift
bins=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    bins+=("$1")
    shift
done
[ $# -gt 0 ] && shift
case "$backend" in
memory | redis) ;;
*)
    echo "BACKEND must be memory or redis" >&2
    exit 2
    ;;
esac
[ ${#bins[@]} -gt 0 ] || { echo "name at least one server binary" >&2; exit 2; }

cargo build --release --quiet
loadgen=target/release/floodgate
port_base=${PORT_BASE:-18000}
http_port=$((port_base + 80))
grpc_port=$((port_base + 81))
redis_port=${REDIS_PORT:-16379}
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null || true' EXIT

redis_flags=()
if [ "$backend" = redis ]; then
    redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
        --logfile /dev/null >/dev/null &
    pids+=($!)
    redis_flags=(--redis-pid "$!" --redis-addr "127.0.0.1:$redis_port")
    until redis-cli -p "$redis_port" ping >/dev/null 2>&1; do sleep 0.05; done
fi

header=1
for bin in "${bins[@]}"; do
    [ "$backend" = redis ] && redis-cli -p "$redis_port" flushall >/dev/null
    RUST_LOG=warn "$bin" serve --rules benches/rules --backend "$backend" \
        --redis-url "redis://127.0.0.1:$redis_port" \
        --grpc-addr "127.0.0.1:$grpc_port" --http-addr "127.0.0.1:$http_port" >/dev/null 2>&1 &
    server=$!
    until curl -sf "http://127.0.0.1:$http_port/readyz" >/dev/null 2>&1; do sleep 0.05; done
    flags=(--format tsv)
    [ $header = 1 ] || flags+=(--no-header)
    "$loadgen" bench --addr "http://127.0.0.1:$grpc_port" --duration "${DURATION:-6}" \
        --warmup "${WARMUP:-2}" --server-pid "$server" "${redis_flags[@]}" "${flags[@]}" "$@" \
        2>/dev/null | awk -v bin="$bin" -v first=$header 'NR == 1 && first { print "binary\t" $0; next } { print bin "\t" $0 }'
    header=0
    kill "$server"
    wait "$server" 2>/dev/null || true
done
