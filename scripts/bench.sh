#!/usr/bin/env bash
# The README's performance figures: a release server with benches/rules, loaded by
# `floodgate bench` over real gRPC on loopback.
#   scripts/bench.sh [extra `floodgate bench` flags, e.g. --descriptors 5]
#   BACKEND=redis scripts/bench.sh     # against a redis-server the script starts
set -euo pipefail
cd "$(dirname "$0")/.."
backend=${BACKEND:-memory}
cargo build --release --quiet
bin=target/release/floodgate
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null || true' EXIT

serve_flags=(--backend "$backend")
if [ "$backend" = redis ]; then
    redis-server --port 16379 --bind 127.0.0.1 --save "" --appendonly no \
        --logfile /dev/null >/dev/null &
    pids+=($!)
    until redis-cli -p 16379 ping >/dev/null 2>&1; do sleep 0.05; done
    serve_flags+=(--redis-url redis://127.0.0.1:16379)
fi

RUST_LOG=warn "$bin" serve --rules benches/rules "${serve_flags[@]}" \
    --grpc-addr 127.0.0.1:18081 --http-addr 127.0.0.1:18080 >/dev/null &
server=$!
pids+=("$server")
until curl -sf http://127.0.0.1:18080/readyz >/dev/null 2>&1; do sleep 0.05; done

if [ "$backend" = redis ]; then
    redis-cli -p 16379 config resetstat >/dev/null
fi
"$bin" bench --addr http://127.0.0.1:18081 --connections 4 --concurrency 64 --keys 10000 \
    --duration 10 --warmup 2 --server-pid "$server" "$@" | tee /tmp/floodgate-bench.txt
if [ "$backend" = redis ]; then
    calls=$(redis-cli -p 16379 info commandstats | tr -d '\r' | sed -n 's/^cmdstat_\([a-z]*\):calls=\([0-9]*\),.*/\1 \2/p')
    echo "redis commands (warm-up included):" $calls
fi
