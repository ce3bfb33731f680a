#!/usr/bin/env bash
# Instructions divvy runs per HIT on the Redis store, divvy's side only
# (framing, parsing, matching, batching, the Redis client's encoding and
# decoding, answering; redis-server's own work is benches/script_instructions.sh's),
# its user space only, counted by valgrind's callgrind: unlike CPU time, the
# count repeats to about 0.1% whatever else the machine is doing.
#
#   benches/redis_instructions.sh [ROUND] [DIVVY_BINARY]
#
# ROUND         HITs a connection sends before it reads their answers, 1 to
#               4096 (default 256; the load benchmark's 1 x 256 pipelined)
# DIVVY_BINARY  the divvy executable (default: built here with `cargo build
#               --profile profiling`); another commit's, for a before/after
# KEEP=FILE     (environment) keep callgrind's dump there, for callgrind_annotate
# MEMORY=1      (environment) the same load on divvy's memory store (no
#               --redis-url, no redis-server counted): the baseline that
#               divvy's side on Redis is held to
#
# It starts redis-server on a free loopback port and `divvy serve` (the load
# benchmark's policy, benches/line_policy.yaml, on that Redis) under
# callgrind, makes the 65,536 actors' counters, zeroes callgrind's counts,
# sends 32,768 HITs over one line-protocol connection in rounds of ROUND
# (each round's answers read before the next is sent), dumps the counts and
# divides them by the HITs. divvy decides what one read brings as one batch,
# so a round larger than a read (about 8 KB, 230 HITs) is more than one
# script call: the HITs per script call are printed too (Redis's `INFO
# commandstats`). Needs valgrind (callgrind_control), redis-server and
# python3. About half a minute.
set -euo pipefail

round=${1:-256}
binary=${2:-}
if ! [[ "$round" =~ ^[0-9]+$ ]] || [ "$round" -lt 1 ] || [ "$round" -gt 4096 ]; then
  echo "ROUND must be a whole number from 1 to 4096" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=benches/callgrind_common.sh
. "$here/callgrind_common.sh"
init_work
if [ -z "$binary" ]; then
  binary=$(profiling_divvy)
fi

redis_port=$(free_port)
line_port=$(free_port)
grpc_port=$(free_port)
http_port=$(free_port)

redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
  --dir "$work" >"$work/redis.log" 2>&1 &
redis_pid=$!
server_pids+=("$redis_pid")

store_args=(--redis-url "redis://127.0.0.1:$redis_port")
store_name=Redis
if [ -n "${MEMORY:-}" ]; then
  store_args=()
  store_name=memory
fi
valgrind --tool=callgrind --callgrind-out-file="$work/out.%p" "$binary" serve \
  --config "$here/line_policy.yaml" --worker-threads 1 --no-watch \
  "${store_args[@]}" \
  --line-addr "127.0.0.1:$line_port" --grpc-addr "127.0.0.1:$grpc_port" \
  --http-addr "127.0.0.1:$http_port" --line-max-batch 4096 \
  >"$work/divvy.log" 2>&1 &
divvy_pid=$!
server_pids+=("$divvy_pid")

# The line-protocol client: HITS HITs from actor START on, SIZE at a time,
# each round's answers read before the next is sent; every answer must be
# OK. It waits for divvy's port (slow to open under callgrind).
cat >"$work/client.py" <<'PY'
import socket, sys, time

port, start, hits, size = (int(a) for a in sys.argv[1:5])
deadline = time.time() + 120
while True:
    try:
        conn = socket.create_connection(("127.0.0.1", port))
        break
    except OSError:
        if time.time() > deadline:
            sys.exit("divvy's line port never opened")
        time.sleep(0.2)
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
reader = conn.makefile("rb")
n = 0
while n < hits:
    k = min(size, hits - n)
    lines = []
    for i in range(k):
        a = (start + n + i) % 65536
        lines.append(b"HIT path=/api/items ip=10.%d.%d.%d\n" % (a >> 16, (a >> 8) & 255, a & 255))
    conn.sendall(b"".join(lines))
    for _ in range(k):
        answer = reader.readline()
        if not answer.startswith(b"OK true "):
            sys.exit("unexpected answer: %r" % answer)
    n += k
PY

# EVALSHA calls Redis has run.
evalsha_calls() {
  redis-cli -p "$redis_port" INFO commandstats |
    sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\).*/\1/p' | grep . || echo 0
}

# Every actor's counter made (in rounds of at least 256), then the counted
# HITs on existing counters.
wait_port "$line_port" "$divvy_pid"
python3 "$work/client.py" "$line_port" 0 65536 $((round > 256 ? round : 256))
grind_control --zero "$divvy_pid"
before=$(evalsha_calls)
python3 "$work/client.py" "$line_port" 0 32768 "$round"
after=$(evalsha_calls)
grind_control --dump=counted "$divvy_pid"
total=$(grind_counted_total "$work/out" "$divvy_pid")
if [ -n "${KEEP:-}" ]; then cp "$work/out.$divvy_pid.1" "$KEEP"; fi
calls=$((after - before))
per_call=""
if [ -z "${MEMORY:-}" ]; then
  per_call="; $(python3 -c "print(f'{32768 / max($calls, 1):.1f}')") HITs a script call"
fi
echo "divvy on the $store_name store, rounds of $round HITs: $((total / 32768)) instructions per HIT" \
  "(32768 HITs counted$per_call)"
