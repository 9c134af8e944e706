#!/usr/bin/env bash
# The README's performance figures: a release server on the memory backend with
# benches/rules, loaded by `floodgate bench` over real gRPC on loopback.
#   scripts/bench.sh [extra `floodgate bench` flags, e.g. --descriptors 5]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
bin=target/release/floodgate
RUST_LOG=warn "$bin" serve --rules benches/rules \
    --grpc-addr 127.0.0.1:18081 --http-addr 127.0.0.1:18080 >/dev/null &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true' EXIT
for _ in $(seq 50); do
    curl -sf http://127.0.0.1:18080/readyz >/dev/null 2>&1 && break
    sleep 0.1
done
"$bin" bench --addr http://127.0.0.1:18081 --connections 4 --concurrency 64 --keys 10000 \
    --duration 10 --warmup 2 --server-pid "$server" "$@"
