#!/usr/bin/env bash
# The README's performance figures: a release server with benches/rules, loaded by
# `floodgate bench` over real gRPC on loopback.
#   scripts/bench.sh [extra `floodgate bench` flags, e.g. --descriptors 5]
#   BACKEND=redis scripts/bench.sh           # against a redis-server the script starts
#   BACKEND=redis-cluster scripts/bench.sh   # against a 3-primary cluster it starts
set -euo pipefail
cd "$(dirname "$0")/.."
backend=${BACKEND:-memory}
cargo build --release --quiet
bin=target/release/floodgate
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null || true' EXIT

# A throwaway redis-server on `port`, its pid appended to `pids`.
start_redis() {
    local port=$1
    shift
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
        --logfile /dev/null "$@" >/dev/null &
    pids+=($!)
    redis_pids+=(--redis-pid "$!")
    until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
}

serve_flags=(--backend "$backend")
redis_pids=()
redis_ports=()
case "$backend" in
memory) ;;
redis)
    start_redis 16379
    redis_ports=(16379)
    serve_flags+=(--redis-url redis://127.0.0.1:16379)
    ;;
redis-cluster)
    dir=$(mktemp -d)
    seeds=()
    for port in 17000 17001 17002; do
        start_redis "$port" --cluster-enabled yes --cluster-config-file "$dir/nodes-$port.conf"
        redis_ports+=("$port")
        seeds+=("127.0.0.1:$port")
    done
    redis-cli --cluster create "${seeds[@]}" --cluster-yes >/dev/null
    until redis-cli -p 17000 cluster info | grep -q cluster_state:ok; do sleep 0.1; done
    urls=$(printf 'redis://%s,' "${seeds[@]}")
    serve_flags+=(--redis-url "${urls%,}")
    ;;
*)
    echo "BACKEND must be memory, redis or redis-cluster" >&2
    exit 2
    ;;
esac

RUST_LOG=warn "$bin" serve --rules benches/rules "${serve_flags[@]}" \
    --grpc-addr 127.0.0.1:18081 --http-addr 127.0.0.1:18080 >/dev/null &
server=$!
pids+=("$server")
until curl -sf http://127.0.0.1:18080/readyz >/dev/null 2>&1; do sleep 0.05; done

for port in "${redis_ports[@]}"; do
    redis-cli -p "$port" config resetstat >/dev/null
done
"$bin" bench --addr http://127.0.0.1:18081 --connections 4 --concurrency 64 --keys 10000 \
    --duration 10 --warmup 2 --server-pid "$server" "${redis_pids[@]}" "$@" |
    tee /tmp/floodgate-bench.txt
if [ ${#redis_ports[@]} -gt 0 ]; then
    # Every command Redis ran, warm-up included, next to the requests the load generator
    # counted after it: the ratio is the commands per request.
    for port in "${redis_ports[@]}"; do
        redis-cli -p "$port" info commandstats | tr -d '\r' |
            sed -n 's/^cmdstat_\([a-z|]*\):calls=\([0-9]*\),.*/\1 \2/p'
    done | awk '{calls[$1] += $2} END {printf "redis commands (warm-up included):"; for (c in calls) printf " %s %d", c, calls[c]; print ""}'
fi
