#!/usr/bin/env bash
# Several server binaries under one load, one after the other against one redis-server, with
# one load generator: the README's before/after rows (ratios are only worth comparing within
# one run of this script).
#   scripts/compare.sh BACKEND BIN [BIN…] [-- floodgate-bench flags]
#   scripts/compare.sh redis /tmp/floodgate-before target/release/floodgate -- --concurrency 256 --connections 16
# BACKEND is memory, redis, or redis-cluster (three primaries, no replicas, on REDIS_PORT and
# the two ports after it). Each row: the binary, then `floodgate-bench --format tsv`'s
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
memory | redis | redis-cluster) ;;
*)
    echo "BACKEND must be memory, redis or redis-cluster" >&2
    exit 2
    ;;
esac
[ ${#bins[@]} -gt 0 ] || { echo "name at least one server binary" >&2; exit 2; }

cargo build --release --quiet
loadgen=target/release/floodgate-bench
port_base=${PORT_BASE:-18000}
http_port=$((port_base + 80))
grpc_port=$((port_base + 81))
redis_port=${REDIS_PORT:-16379}
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null || true' EXIT

redis_flags=()
redis_ports=()
case "$backend" in
redis) redis_ports=("$redis_port") ;;
redis-cluster) redis_ports=("$redis_port" $((redis_port + 1)) $((redis_port + 2))) ;;
esac
cluster_dir=""
if [ "$backend" = redis-cluster ]; then
    cluster_dir=$(mktemp -d)
    trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null || true; rm -rf "$cluster_dir"' EXIT
fi
for port in "${redis_ports[@]}"; do
    cluster_flags=()
    if [ -n "$cluster_dir" ]; then
        cluster_flags=(--cluster-enabled yes --cluster-config-file "$cluster_dir/nodes-$port.conf"
            --dir "$cluster_dir")
    fi
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
        --logfile /dev/null "${cluster_flags[@]}" >/dev/null &
    pids+=($!)
    redis_flags+=(--redis-pid "$!" --redis-addr "127.0.0.1:$port")
    until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
done
redis_url="redis://127.0.0.1:$redis_port"
if [ "$backend" = redis-cluster ]; then
    addresses=()
    urls=()
    for port in "${redis_ports[@]}"; do
        addresses+=("127.0.0.1:$port")
        urls+=("redis://127.0.0.1:$port")
    done
    redis-cli --cluster create "${addresses[@]}" --cluster-yes >/dev/null
    until redis-cli -p "$redis_port" cluster info | grep -q cluster_state:ok; do sleep 0.1; done
    redis_url=$(IFS=,; echo "${urls[*]}")
fi

header=1
for bin in "${bins[@]}"; do
    for port in "${redis_ports[@]}"; do redis-cli -p "$port" flushall >/dev/null; done
    RUST_LOG=warn "$bin" serve --rules benches/rules --backend "$backend" \
        --redis-url "$redis_url" \
        --grpc-addr "127.0.0.1:$grpc_port" --http-addr "127.0.0.1:$http_port" >/dev/null 2>&1 &
    server=$!
    until curl -sf "http://127.0.0.1:$http_port/readyz" >/dev/null 2>&1; do sleep 0.05; done
    flags=(--format tsv)
    [ $header = 1 ] || flags+=(--no-header)
    "$loadgen" --addr "http://127.0.0.1:$grpc_port" --duration "${DURATION:-6}" \
        --warmup "${WARMUP:-2}" --server-pid "$server" "${redis_flags[@]}" "${flags[@]}" "$@" \
        2>/dev/null | awk -v bin="$bin" -v first=$header 'NR == 1 && first { print "binary\t" $0; next } { print bin "\t" $0 }'
    header=0
    kill "$server"
    wait "$server" 2>/dev/null || true
done
