#!/usr/bin/env bash
# Instructions redis-server spends per counter hit inside floodgate's script: redis-server
# runs under callgrind (counts instructions, not seconds: repeatable on a busy machine), and a
# small driver sends batch calls of one limit (lua/README.md's layout), fixed_window unless
# ALGORITHM names another, each hit costing COST (1).
#   scripts/lua-cost.sh [BATCH] [KEYS]     # hits per call (100), distinct counters (100)
#   ALGORITHM=sliding_log COST=10 scripts/lua-cost.sh
# Needs valgrind (apt-get install valgrind) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
batch=${1:-100}
keys=${2:-100}
algorithm=${ALGORITHM:-fixed_window}
cost=${COST:-1}
port=${PORT:-16400}
out=$(mktemp -d)
valgrind --tool=callgrind --callgrind-out-file="$out/cg.%p" "$(command -v redis-server)" \
    --port "$port" --save "" --appendonly no >/dev/null 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait 2>/dev/null; rm -rf "$out"' EXIT
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.2; done
drive() {
    python3 - "$port" "$batch" "$keys" "$1" "$algorithm" "$cost" <<'PY'
import random, socket, sys
port, batch, keys, total = (int(a) for a in sys.argv[1:5])
algorithm, cost = sys.argv[5], int(sys.argv[6])
parts = ["prelude", "fixed_window", "sliding_window", "sliding_log", "token_bucket", "gcra",
         "all_or_nothing", "batch"]
source = "".join(open(f"lua/{p}.lua").read() for p in parts)
def command(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)
conn = socket.create_connection(("127.0.0.1", port))
reader = conn.makefile("rb")
def reply():
    line = reader.readline()
    kind, rest = line[:1], line[1:-2]
    if kind == b"$":
        return None if int(rest) < 0 else reader.read(int(rest) + 2)[:-2]
    if kind == b"*":
        return [reply() for _ in range(int(rest))]
    if kind == b"-":
        raise SystemExit(rest.decode())
    return rest
conn.sendall(command("SCRIPT", "LOAD", source))
sha = reply().decode()
for _ in range(total // batch):
    # Redis' clock, a deadline far ahead (as floodgate sends one), one limit.
    args = ["EVALSHA", sha, 0, "", 4102444800000000, 1, algorithm, 1000000, 60000000, 1000000, 60,
            "", "", "", "", 0, "each", batch, 1, cost]
    args += ["{bench:user.0:0:user_id=k%d}:%s:60" % (random.randrange(keys), algorithm)
             for _ in range(batch)]
    conn.sendall(command(*args))
    reply()
PY
}
drive 2000                                  # warm: the script loaded, the keys there
callgrind_control -z "$server" >/dev/null 2>&1
drive 10000
callgrind_control -d "$server" >/dev/null 2>&1
total=$(grep -h "^totals:" "$out"/cg.* | tail -1 | awk '{print $2}')
echo "$algorithm, cost $cost, batch $batch, $keys counters: $((total / 10000)) instructions per hit"
