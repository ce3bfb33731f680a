#!/usr/bin/env bash
# Instructions divvy runs per HIT on the Redis store, divvy's side only
# (framing, parsing, matching, batching, the Redis client's encoding and
# decoding, answering; redis-server's own work is benches/script_instructions.sh's),
# counted by valgrind's callgrind: unlike CPU time, the count repeats to
# within about a percent whatever else the machine is doing.
#
#   benches/redis_instructions.sh [BATCH] [DIVVY_BINARY]
#
# BATCH         HITs a connection sends before it reads their answers, 1 to
#               4096 (default 256; the load benchmark's 1 x 256 pipelined)
# DIVVY_BINARY  the divvy executable (default: built here with `cargo build
#               --profile profiling`); another commit's, for a before/after
#
# It starts redis-server on a free loopback port and `divvy serve` (the load
# benchmark's policy, benches/line_policy.yaml, on that Redis) under
# callgrind, makes the 65,536 actors' counters, zeroes callgrind's counts,
# sends 32,768 HITs over one line-protocol connection in rounds of BATCH
# (each round is read whole by divvy and decided as one batch: one script
# call), dumps the counts and divides them by the HITs. Needs valgrind
# (callgrind_control, callgrind_annotate), redis-server and python3. About a
# minute.
set -euo pipefail

batch=${1:-256}
binary=${2:-}
if ! [[ "$batch" =~ ^[0-9]+$ ]] || [ "$batch" -lt 1 ] || [ "$batch" -gt 4096 ]; then
  echo "BATCH must be a whole number from 1 to 4096" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
if [ -z "$binary" ]; then
  (cd "$here/.." && cargo build --profile profiling --bin divvy >&2)
  binary="$here/../target/profiling/divvy"
fi

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
redis_port=$(free_port)
line_port=$(free_port)
grpc_port=$(free_port)
http_port=$(free_port)

redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
  --dir "$work" >"$work/redis.log" 2>&1 &
pids+=($!)

valgrind --tool=callgrind --callgrind-out-file="$work/out.%p" "$binary" serve \
  --config "$here/line_policy.yaml" --worker-threads 1 --no-watch \
  --redis-url "redis://127.0.0.1:$redis_port" \
  --line-addr "127.0.0.1:$line_port" --grpc-addr "127.0.0.1:$grpc_port" \
  --http-addr "127.0.0.1:$http_port" --line-max-batch 4096 \
  >"$work/divvy.log" 2>&1 &
divvy=$!
pids+=($divvy)

python3 - "$line_port" "$batch" "$divvy" "$work" <<'PY'
import socket, subprocess, sys, time

port, batch, pid, work = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
ACTORS, COUNTED = 65536, 32768

deadline = time.time() + 120
while True:
    try:
        conn = socket.create_connection(("127.0.0.1", port))
        break
    except OSError:
        if time.time() > deadline:
            sys.exit("divvy did not start: see its log")
        time.sleep(0.2)
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
reader = conn.makefile("rb")

def rounds(start, hits):
    """Sends `hits` HITs from actor `start` on, `batch` at a time, each
    round's answers read before the next is sent; every answer must be OK."""
    n = 0
    while n < hits:
        k = min(batch, hits - n)
        lines = b"".join(
            b"HIT path=/api/items ip=10.%d.%d.%d\n"
            % divmod_ip((start + n + i) % ACTORS) for i in range(k))
        conn.sendall(lines)
        for _ in range(k):
            answer = reader.readline()
            if not answer.startswith(b"OK true "):
                sys.exit("unexpected answer: %r" % answer)
        n += k

def divmod_ip(a):
    return (a >> 16, (a >> 8) & 255, a & 255)

# Every actor's counter made (in rounds of 256 whatever BATCH is), then the
# counted HITs on existing counters.
rounds(0, ACTORS) if batch >= 256 else [rounds(i, 256) for i in range(0, ACTORS, 256)]
subprocess.run(["callgrind_control", "--zero", pid], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
rounds(0, COUNTED)
subprocess.run(["callgrind_control", "--dump=counted", pid], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(COUNTED)
PY
sleep 1
dump=$(ls "$work"/out.*.1 2>/dev/null | head -1)
if [ -z "$dump" ]; then
  echo "no callgrind dump: see $work/divvy.log" >&2
  cat "$work/divvy.log" >&2
  exit 1
fi
total=$(callgrind_annotate "$dump" | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')
echo "divvy on the Redis store, $batch HITs a batch: $((total / 32768)) instructions per HIT (32768 HITs counted)"
if [ -n "${KEEP:-}" ]; then cp "$dump" "$KEEP"; fi
