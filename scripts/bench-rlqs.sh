#!/usr/bin/env bash
# Envoy with a per-request rate-limit call (the ratelimit filter, RLS) against Envoy with
# the Rate Limit Quota Service (the rate_limit_quota filter, RLQS), in one run: the same
# floodgate binary and rule (a limit never reached), the same Envoy 1.40 answering itself,
# the same HTTP load (ApacheBench, keep-alive). Prints Envoy's requests a second and p99,
# and floodgate's CPU per Envoy request, for each.
#
#   scripts/bench-rlqs.sh                  # 20,000 requests, 32 at once
#   REQUESTS=50000 CONCURRENCY=64 scripts/bench-rlqs.sh
#
# Needs: a release build (cargo build --release), Envoy (.venv/bin/envoy or FLOODGATE_ENVOY),
# ab (apt-get install apache2-utils).
set -euo pipefail
cd "$(dirname "$0")/.."

requests=${REQUESTS:-20000}
concurrency=${CONCURRENCY:-32}
server_bin=${SERVER_BIN:-target/release/floodgate}
envoy_bin=${FLOODGATE_ENVOY:-.venv/bin/envoy}
work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# CPU seconds (user + system) process $1 has used.
cpu_seconds() {
    awk -v tick="$(getconf CLK_TCK)" '{ print ($14 + $15) / tick }' "/proc/$1/stat"
}

# Waits for an answer from URL $1; on none, shows log $2.
wait_for_http() {
    for _ in $(seq 1 100); do
        curl -s -o /dev/null "$1" && return 0
        sleep 0.1
    done
    echo "no answer from $1:" >&2
    cat "$2" >&2
    return 1
}

echo "mode   requests/s   p99 ms   floodgate CPU µs per Envoy request   floodgate calls"
for mode in rls rlqs; do
    grpc=$(free_port) http=$(free_port) listen=$(free_port) admin=$(free_port)
    backend=$(free_port)
    mkdir -p "$work/$mode/rules"
    rules=scripts/bench-envoy/rules.yaml
    [ "$mode" = rlqs ] && rules=scripts/bench-envoy/rules-rlqs.yaml
    cp "$rules" "$work/$mode/rules/rules.yaml"
    RUST_LOG=warn "$server_bin" serve --rules "$work/$mode/rules" --grpc-addr "127.0.0.1:$grpc" \
        --http-addr "127.0.0.1:$http" >"$work/$mode/floodgate.log" 2>&1 &
    server=$!
    pids+=("$server")
    sed -e "s/ADMIN_PORT/$admin/; s/LISTEN_PORT/$listen/; s/GRPC_PORT/$grpc/" \
        -e "s/BACKEND_PORT/$backend/g" \
        "scripts/bench-envoy/$mode.yaml" >"$work/$mode/envoy.yaml"
    "$envoy_bin" -c "$work/$mode/envoy.yaml" --disable-hot-restart --base-id "$listen" \
        --concurrency 1 --log-level error >"$work/$mode/envoy.log" 2>&1 &
    pids+=("$!")
    wait_for_http "http://127.0.0.1:$http/healthz" "$work/$mode/floodgate.log"
    wait_for_http "http://127.0.0.1:$listen/" "$work/$mode/envoy.log"
    # Warm-up: connections, the RLQS stream and its first assignment.
    ab -q -k -n 2000 -c "$concurrency" -H 'x-user: alice' "http://127.0.0.1:$listen/" >/dev/null
    before=$(cpu_seconds "$server")
    ab -q -k -n "$requests" -c "$concurrency" -H 'x-user: alice' \
        "http://127.0.0.1:$listen/" >"$work/$mode/ab.txt"
    after=$(cpu_seconds "$server")
    rate=$(awk '/Requests per second/ { print $4 }' "$work/$mode/ab.txt")
    p99=$(awk '$1 == "99%" { print $2 }' "$work/$mode/ab.txt")
    failed=$(awk '/Non-2xx responses/ { print $3 }' "$work/$mode/ab.txt")
    calls=$(curl -s "http://127.0.0.1:$http/metrics" |
        awk '/^floodgate_requests_total\{protocol="grpc"/ { n += $2 } /^floodgate_rlqs_reports_total / { n += $2 } END { print n + 0 }')
    per_request=$(awk -v b="$before" -v a="$after" -v n="$requests" 'BEGIN { printf "%.2f", (a - b) * 1e6 / n }')
    printf '%-6s %-12s %-8s %-36s %s%s\n' "$mode" "$rate" "$p99" "$per_request" "$calls" \
        "${failed:+   (non-2xx: $failed)}"
    kill "${pids[@]}" 2>/dev/null || true
    wait 2>/dev/null || true
    pids=()
done
