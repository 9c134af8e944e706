#!/usr/bin/env bash
# The README's performance figures: a release server with benches/rules, loaded by
# `floodgate-bench` over real gRPC on loopback.
#   scripts/bench.sh [extra `floodgate-bench` flags, e.g. --descriptors 5]
#   BACKEND=redis scripts/bench.sh           # against a redis-server the script starts
#   BACKEND=redis-cluster scripts/bench.sh   # against a 3-primary cluster it starts
#
# Without CURVE: one closed-loop run, 64 in flight over 4 connections, as text (also in
# /tmp/floodgate-bench.txt). With CURVE, the server and Redis start once and serve several
# runs, one TSV row each, collected into a table printed at the end and written to
# /tmp/floodgate-curve-<backend>.tsv:
#   CURVE=concurrency   the closed loop at each of CONCURRENCIES (default "16 64 256 1024"),
#                       over concurrency/4 connections (rounded up, at most 16): a few
#                       requests in flight per connection, as a proxy's pool would carry
#   CURVE=rate          the closed loop at 256 in flight over 16 connections for the peak
#                       decided requests/s, then the open loop over 16 connections at each
#                       of RATES (requests/s) if given, else at 0.25 0.5 0.75 1 1.25 1.5 2 4
#                       times that peak
# Every run: DURATION measured seconds (default 10) after WARMUP seconds (default 2). Extra
# flags go to every run, after the script's own, and a flag given twice takes its last value
# (so `--connections 8` overrides the script's choice).
#
# Redis as the bottleneck on a small machine: REDIS_CPU_QUOTA="PERCENT [PERIOD_US]" runs every
# redis-server under a cgroup CPU quota (../shared/tools/redis-cpu-quota, or REDIS_CPU_QUOTA_TOOL;
# root and a cgroup cpu controller needed), e.g. REDIS_CPU_QUOTA="20 5000": a fifth of a core in
# 5 ms periods, so Redis saturates while the server and the load generator keep CPU to spare.
#
# Comparing builds in one session: SERVER_BIN is the server binary to measure (default: the
# release build of this tree); the load generator is always this tree's release build.
#
# Placement, for a many-core machine: TASKSET_SERVER, TASKSET_REDIS, TASKSET_LOADGEN are cpu
# lists for `taskset -c` (empty: no pinning); SERVER_THREADS becomes the server's
# TOKIO_WORKER_THREADS. Ports: PORT_BASE (default 18000; HTTP on +80, gRPC on +81),
# REDIS_PORT (default 16379), CLUSTER_PORT (default 17000, and the two after it).
set -euo pipefail
cd "$(dirname "$0")/.."
backend=${BACKEND:-memory}
curve=${CURVE:-}
duration=${DURATION:-10}
warmup=${WARMUP:-2}
port_base=${PORT_BASE:-18000}
http_port=$((port_base + 80))
grpc_port=$((port_base + 81))
redis_port=${REDIS_PORT:-16379}
cluster_port=${CLUSTER_PORT:-17000}
extra=("$@")
case "$curve" in
"" | rate | concurrency) ;;
*)
    echo "CURVE must be rate or concurrency (or unset)" >&2
    exit 2
    ;;
esac

cargo build --release --quiet
bin=target/release/floodgate
loadgen=target/release/floodgate-bench
server_bin=${SERVER_BIN:-$bin}
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null || true' EXIT

# Command prefixes that pin a process to its cpu list. taskset and env exec what they run,
# so a background process' $! is the pid of the process itself.
pin_server=() pin_redis=() pin_loadgen=()
[ -z "${TASKSET_SERVER:-}" ] || pin_server=(taskset -c "$TASKSET_SERVER")
[ -z "${TASKSET_REDIS:-}" ] || pin_redis=(taskset -c "$TASKSET_REDIS")
[ -z "${TASKSET_LOADGEN:-}" ] || pin_loadgen=(taskset -c "$TASKSET_LOADGEN")

# A throwaway redis-server on `port`: its pid to kill at exit, and to the bench its pid (for
# CPU time) and address (for command counts).
redis_flags=()
redis_server=(redis-server)
if [ -n "${REDIS_CPU_QUOTA:-}" ]; then
    # The tool runs redis-server itself, with the arguments after `--`.
    # shellcheck disable=SC2206 # PERCENT and PERIOD_US are two words
    redis_server=("${REDIS_CPU_QUOTA_TOOL:-../shared/tools/redis-cpu-quota}" $REDIS_CPU_QUOTA --)
fi
start_redis() {
    local port=$1
    shift
    "${pin_redis[@]}" "${redis_server[@]}" --port "$port" --bind 127.0.0.1 --save "" \
        --appendonly no --logfile /dev/null "$@" >/dev/null &
    pids+=($!)
    until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
    # Under a quota $! is the wrapper's shell; Redis names its own pid (for its CPU time).
    local pid
    pid=$(redis-cli -p "$port" info server | tr -d '\r' | awk -F: '$1 == "process_id" { print $2 }')
    redis_flags+=(--redis-pid "$pid" --redis-addr "127.0.0.1:$port")
}

serve_flags=(--backend "$backend")
case "$backend" in
memory) ;;
redis)
    start_redis "$redis_port"
    serve_flags+=(--redis-url "redis://127.0.0.1:$redis_port")
    ;;
redis-cluster)
    dir=$(mktemp -d)
    seeds=()
    for port in "$cluster_port" $((cluster_port + 1)) $((cluster_port + 2)); do
        start_redis "$port" --cluster-enabled yes --cluster-config-file "$dir/nodes-$port.conf"
        seeds+=("127.0.0.1:$port")
    done
    redis-cli --cluster create "${seeds[@]}" --cluster-yes >/dev/null
    until redis-cli -p "$cluster_port" cluster info | grep -q cluster_state:ok; do sleep 0.1; done
    urls=$(printf 'redis://%s,' "${seeds[@]}")
    serve_flags+=(--redis-url "${urls%,}")
    ;;
*)
    echo "BACKEND must be memory, redis or redis-cluster" >&2
    exit 2
    ;;
esac

server_env=(RUST_LOG=warn)
if [ -n "${SERVER_THREADS:-}" ]; then
    server_env+=("TOKIO_WORKER_THREADS=$SERVER_THREADS")
fi
"${pin_server[@]}" env "${server_env[@]}" "$server_bin" serve --rules benches/rules "${serve_flags[@]}" \
    --grpc-addr "127.0.0.1:$grpc_port" --http-addr "127.0.0.1:$http_port" >/dev/null &
server=$!
pids+=("$server")
until curl -sf "http://127.0.0.1:$http_port/readyz" >/dev/null 2>&1; do sleep 0.05; done

# One run against the server; the flags given, then the script's extra flags.
bench() {
    "${pin_loadgen[@]}" "$loadgen" --addr "http://127.0.0.1:$grpc_port" --keys 10000 \
        --duration "$duration" --warmup "$warmup" --server-pid "$server" "${redis_flags[@]}" \
        "$@" "${extra[@]}"
}

if [ -z "$curve" ]; then
    bench --connections 4 --concurrency 64 | tee /tmp/floodgate-bench.txt
    exit 0
fi

# One point of the curve: a run with the given flags, its TSV row kept (and shown as it
# comes, on stderr).
header=
rows=()
point() {
    local out
    out=$(bench --format tsv "$@")
    header=$(head -n 1 <<<"$out")
    rows+=("$(tail -n 1 <<<"$out")")
    echo "${rows[-1]}" >&2
}

# The value of `column` in the last row collected.
last() {
    printf '%s\n%s\n' "$header" "${rows[-1]}" |
        awk -F'\t' -v name="$1" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == name) c = i; next } { print $c }'
}

# Closed-loop connections for a concurrency: a quarter of it, rounded up, 1 to 16.
connections_for() {
    local connections=$((($1 + 3) / 4))
    echo $((connections > 16 ? 16 : connections))
}

case "$curve" in
concurrency)
    for concurrency in ${CONCURRENCIES:-16 64 256 1024}; do
        point --concurrency "$concurrency" --connections "$(connections_for "$concurrency")"
    done
    ;;
rate)
    point --concurrency 256 --connections 16
    peak=$(last decided_per_s)
    rates=${RATES:-}
    if [ -z "$rates" ]; then
        if ! awk -v peak="$peak" 'BEGIN { exit !(peak > 0) }'; then
            echo "the closed-loop run decided nothing (decided_per_s $peak): no peak to scale" >&2
            exit 1
        fi
        rates=$(awk -v peak="$peak" 'BEGIN {
            n = split("0.25 0.5 0.75 1 1.25 1.5 2 4", factors, " ")
            for (i = 1; i <= n; i++) printf "%.0f ", peak * factors[i]
        }')
    fi
    for rate in $rates; do
        point --rate "$rate" --connections 16
    done
    ;;
esac

table=/tmp/floodgate-curve-$backend.tsv
{
    echo "$header"
    printf '%s\n' "${rows[@]}"
} >"$table"
echo "CURVE=$curve, BACKEND=$backend (also in $table; - is a value not measured):"
# Aligned columns, an empty field shown as '-' (`column -t` would drop it).
awk -F'\t' '{
    for (i = 1; i <= NF; i++) {
        cell[NR, i] = ($i == "" ? "-" : $i)
        if (length(cell[NR, i]) > width[i]) width[i] = length(cell[NR, i])
    }
    if (NF > fields) fields = NF
}
END {
    for (r = 1; r <= NR; r++) {
        line = ""
        for (i = 1; i < fields; i++) line = line sprintf("%-" width[i] + 2 "s", cell[r, i])
        print line cell[r, fields]
    }
}' "$table"
