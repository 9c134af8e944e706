#!/usr/bin/env bash
# floodgate beside Limitador (the Rust peer that speaks Envoy's RLS), in one run: both servers
# built from source, equivalent rules, the same load generator (`floodgate-bench`), the same
# Redis, the same cores, alternating. docs/performance.md shows its tables.
#   scripts/versus.sh                  # the whole matrix; TSV in $OUT, ratios on stdout
#   CORES=2 BACKENDS=memory DESCRIPTORS=1 REPS=1 DURATION=2 scripts/versus.sh
#
# The matrix (each a space-separated list):
#   CORES          server cores (default "1 2 4 8"; those the machine lacks are left out)
#   BACKENDS       memory redis (default both)
#   DESCRIPTORS    descriptors per request (default "1 5")
#   CONCURRENCIES  closed-loop requests in flight (default "64 256"), over in-flight/16
#                  connections (at least 4): 4 at 64, 16 at 256
#   OPEN_SHARES    open-loop rates as shares of Limitador's closed-loop peak at the largest
#                  concurrency, over 16 connections (default "0.8"; empty: no open loop)
# Each point: REPS runs per server (default 2), DURATION measured seconds (6) after WARMUP
# (2); the servers take turns, and which goes first alternates from one rep to the next.
#
# Placement: with fewer server cores than the machine has, the server is pinned to cores
# 0..N-1, Redis to the next core, the load generator to the rest (taskset); both servers'
# runtimes size their thread pools from the cores they are given. With as many server cores
# as the machine has, nothing is pinned and the three share the machine.
#
# Rules: one limit per `user_id` descriptor, 1,000,000 a second (never reached), values drawn
# from 10,000 keys: floodgate's rule applies to each of a request's descriptors; Limitador's
# limits file has one limit per descriptor position. Both count exactly (Limitador's `redis`
# storage, not its write-behind `redis_cached`).
#
# Binaries: FLOODGATE_BIN (default: this tree's release build), LIMITADOR_BIN (default: built
# by ../shared/tools/build-limitador, 12-22 minutes on 2 cores the first time), LOADGEN_BIN
# (the load generator, default: this tree's release build of floodgate-bench). Ports:
# PORT_BASE (default 19000: floodgate's gRPC +1 and HTTP +2, Limitador's +3 and +4),
# REDIS_PORT (default 19379). Output: every run as one TSV row in OUT (default
# /tmp/versus.tsv): server, cores, backend, then `floodgate-bench --format tsv`'s columns;
# then the ratios of medians, floodgate over Limitador, one line per point.
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${REPS:-2}
duration=${DURATION:-6}
warmup=${WARMUP:-2}
out=${OUT:-/tmp/versus.tsv}
port_base=${PORT_BASE:-19000}
redis_port=${REDIS_PORT:-19379}
read -ra core_counts <<<"${CORES:-1 2 4 8}"
read -ra backends <<<"${BACKENDS:-memory redis}"
read -ra descriptor_counts <<<"${DESCRIPTORS:-1 5}"
read -ra concurrencies <<<"${CONCURRENCIES:-64 256}"
read -ra open_shares <<<"${OPEN_SHARES-0.8}"

if [ -z "${FLOODGATE_BIN:-}" ] || [ -z "${LOADGEN_BIN:-}" ]; then
    cargo build --release --quiet
fi
FLOODGATE_BIN=${FLOODGATE_BIN:-target/release/floodgate}
loadgen=${LOADGEN_BIN:-target/release/floodgate-bench}
limitador=${LIMITADOR_BIN:-$(../shared/tools/build-limitador)}
machine_cores=$(nproc)

work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# The rules, written once: floodgate's, and a Limitador limits file per descriptor count
# (each in a directory of its own: Limitador watches the file's directory).
mkdir -p "$work/floodgate"
cat >"$work/floodgate/versus.yaml" <<'EOF'
domain: bench
descriptors:
  - key: user_id
    rate_limit:
      unit: second
      requests_per_unit: 1000000
EOF
for count in "${descriptor_counts[@]}"; do
    mkdir -p "$work/limitador-$count"
    for ((i = 0; i < count; i++)); do
        printf -- '- namespace: bench\n  max_value: 1000000\n  seconds: 1\n  conditions: []\n  variables: ["descriptors[%d].user_id"]\n' "$i"
    done >"$work/limitador-$count/limits.yaml"
done

# `taskset -c LIST` for a cpu list, or nothing when the list is empty.
pinned() {
    if [ -n "$1" ]; then echo "taskset -c $1"; fi
}

# Waits until `url` answers, failing after 30 s or when `pid` has died.
wait_for() {
    local url=$1 pid=$2
    for _ in $(seq 600); do
        curl -sf "$url" >/dev/null 2>&1 && return 0
        kill -0 "$pid" 2>/dev/null || { echo "the server exited before $url answered" >&2; return 1; }
        sleep 0.05
    done
    echo "$url did not answer within 30 s" >&2
    return 1
}

# Starts `server` (floodgate or limitador) for `backend` and `descriptors` on the server's
# cpu list; sets $server_pid and $server_addr.
start_server() {
    local server=$1 backend=$2 count=$3 cpus=$4
    # shellcheck disable=SC2046 # the taskset prefix is words
    case "$server" in
    floodgate)
        local flags=(--backend "$backend")
        [ "$backend" = memory ] || flags+=(--redis-url "redis://127.0.0.1:$redis_port")
        RUST_LOG=warn $(pinned "$cpus") "$FLOODGATE_BIN" serve --rules "$work/floodgate" "${flags[@]}" \
            --grpc-addr "127.0.0.1:$((port_base + 1))" --http-addr "127.0.0.1:$((port_base + 2))" \
            >"$work/floodgate.log" 2>&1 &
        server_pid=$!
        server_addr=http://127.0.0.1:$((port_base + 1))
        wait_for "http://127.0.0.1:$((port_base + 2))/readyz" "$server_pid"
        ;;
    limitador)
        local storage=(memory)
        [ "$backend" = memory ] || storage=(redis "redis://127.0.0.1:$redis_port")
        RUST_LOG=error $(pinned "$cpus") "$limitador" -b 127.0.0.1 -p "$((port_base + 3))" \
            -B 127.0.0.1 -P "$((port_base + 4))" "$work/limitador-$count/limits.yaml" "${storage[@]}" \
            >"$work/limitador.log" 2>&1 &
        server_pid=$!
        server_addr=http://127.0.0.1:$((port_base + 3))
        wait_for "http://127.0.0.1:$((port_base + 4))/status" "$server_pid"
        ;;
    esac
    pids+=("$server_pid")
}

stop_server() {
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
}

# One load against the running server; its TSV row, after the point's own columns.
load() {
    local label=$1 loadgen_cpus=$2
    shift 2
    local redis_flags=()
    [ -z "$redis_pid" ] || redis_flags=(--redis-pid "$redis_pid" --redis-addr "127.0.0.1:$redis_port")
    local rows
    # shellcheck disable=SC2046
    rows=$($(pinned "$loadgen_cpus") "$loadgen" --addr "$server_addr" --keys 10000 \
        --duration "$duration" --warmup "$warmup" --server-pid "$server_pid" \
        "${redis_flags[@]}" --format tsv "$@")
    [ -s "$out" ] || printf 'server\tcores\tbackend\t%s\n' "$(head -n 1 <<<"$rows")" >"$out"
    printf '%s\t%s\n' "$label" "$(tail -n 1 <<<"$rows")" | tee -a "$out" >&2
}

# REPS rounds of both servers at one point (which goes first alternates), each started
# afresh and given every load named: the flags of one `floodgate-bench` run each.
alternate() {
    local backend=$1 count=$2
    shift 2
    for ((rep = 0; rep < reps; rep++)); do
        local order=(limitador floodgate) server flags
        ((rep % 2 == 0)) || order=(floodgate limitador)
        for server in "${order[@]}"; do
            [ -z "$redis_pid" ] || redis-cli -p "$redis_port" flushall >/dev/null
            start_server "$server" "$backend" "$count" "$server_cpus"
            for flags in "$@"; do
                # shellcheck disable=SC2086 # one load's flags, split into words
                load "$server	$cores	$backend" "$loadgen_cpus" --descriptors "$count" $flags
            done
            stop_server
        done
    done
}

# Closed-loop connections for a concurrency: one per 16 in flight, at least 4.
connections_for() {
    local connections=$(($1 / 16))
    echo $((connections < 4 ? 4 : connections))
}

# The median of column `name` over the rows of `server` at one point of OUT.
median_of() {
    local name=$1 server=$2 cores=$3 backend=$4 count=$5 mode=$6 load=$7
    awk -F'\t' -v name="$name" -v server="$server" -v cores="$cores" -v backend="$backend" \
        -v count="$count" -v mode="$mode" -v load="$load" '
        NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
        $col["server"] == server && $col["cores"] == cores && $col["backend"] == backend &&
        $col["descriptors"] == count && $col["mode"] == mode &&
        (mode == "closed" ? $col["concurrency"] : $col["offered_rps"]) == load { v[n++] = $col[name] }
        END {
            if (n == 0) { print ""; exit }
            for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
            print (n % 2 ? v[(n - 1) / 2] : (v[n / 2 - 1] + v[n / 2]) / 2)
        }' "$out"
}

: >"$out"

points=()
done_cores=" "
for cores in "${core_counts[@]}"; do
    [[ "$done_cores" != *" $cores "* ]] || continue
    done_cores+="$cores "
    if [ "$cores" -gt "$machine_cores" ]; then
        echo "leaving out $cores server cores: this machine has $machine_cores" >&2
        continue
    fi
    server_cpus="" redis_cpus="" loadgen_cpus=""
    if [ "$cores" -lt "$machine_cores" ]; then
        server_cpus=0-$((cores - 1))
        redis_cpus=$((cores < machine_cores - 1 ? cores : machine_cores - 1))
        first_load=$((cores < machine_cores - 1 ? cores + 1 : cores))
        loadgen_cpus=$first_load-$((machine_cores - 1))
    fi
    for backend in "${backends[@]}"; do
        redis_pid=""
        if [ "$backend" = redis ]; then
            # shellcheck disable=SC2046
            $(pinned "$redis_cpus") redis-server --port "$redis_port" --bind 127.0.0.1 --save "" \
                --appendonly no --logfile /dev/null >/dev/null &
            redis_pid=$!
            pids+=("$redis_pid")
            until redis-cli -p "$redis_port" ping >/dev/null 2>&1; do sleep 0.05; done
        fi
        for count in "${descriptor_counts[@]}"; do
            top=${concurrencies[-1]}
            closed_loads=()
            for concurrency in "${concurrencies[@]}"; do
                closed_loads+=("--concurrency $concurrency --connections $(connections_for "$concurrency")")
                points+=("$cores $backend $count closed $concurrency")
            done
            alternate "$backend" "$count" "${closed_loads[@]}"
            peak=$(median_of decided_per_s limitador "$cores" "$backend" "$count" closed "$top")
            for share in "${open_shares[@]}"; do
                rate=$(awk -v peak="$peak" -v share="$share" 'BEGIN { printf "%.0f", peak * share }')
                [ "$rate" -gt 0 ] || continue
                alternate "$backend" "$count" "--rate $rate --connections 16"
                points+=("$cores $backend $count open $rate")
            done
        done
        if [ -n "$redis_pid" ]; then
            kill "$redis_pid"
            wait "$redis_pid" 2>/dev/null || true
        fi
    done
done

echo "every run: $out"
echo "medians over $reps runs each, floodgate ÷ Limitador (p99: floodgate vs Limitador, ms):"
printf 'cores\tbackend\tdescriptors\tload\tdecided/s\tratio\tp50 ratio\tp99\tp99 ratio\n'
for point in "${points[@]}"; do
    read -r cores backend count mode load <<<"$point"
    f=$(median_of decided_per_s floodgate "$cores" "$backend" "$count" "$mode" "$load")
    l=$(median_of decided_per_s limitador "$cores" "$backend" "$count" "$mode" "$load")
    f50=$(median_of p50_ms floodgate "$cores" "$backend" "$count" "$mode" "$load")
    l50=$(median_of p50_ms limitador "$cores" "$backend" "$count" "$mode" "$load")
    f99=$(median_of p99_ms floodgate "$cores" "$backend" "$count" "$mode" "$load")
    l99=$(median_of p99_ms limitador "$cores" "$backend" "$count" "$mode" "$load")
    label=$([ "$mode" = closed ] && echo "closed $load in flight" || echo "open $load/s")
    awk -v c="$cores" -v b="$backend" -v n="$count" -v label="$label" -v f="$f" -v l="$l" \
        -v f50="$f50" -v l50="$l50" -v f99="$f99" -v l99="$l99" 'function ratio(a, b) {
            return (b > 0 ? sprintf("%.2f", a / b) : "-")
        }
        BEGIN {
            printf "%s\t%s\t%s\t%s\t%.0f vs %.0f\t%s\t%s\t%.2f vs %.2f\t%s\n", c, b, n, label,
                f, l, ratio(f, l), ratio(f50, l50), f99, l99, ratio(f99, l99)
        }'
done
