#!/usr/bin/env bash
# Instructions per HIT of the line-protocol path in-process (framing,
# parsing, matching, the memory store, answering; no kernel), counted by
# valgrind's callgrind: unlike CPU time, the count repeats to within about a
# percent whatever else the machine is doing, so a change to the path can be
# measured to a percent.
#
#   benches/line_instructions.sh [BATCH] [CORE_BENCH_BINARY]
#   benches/line_instructions.sh server [CONNECTIONS] [SERVER]
#
# BATCH               HITs a batch, 1 to 8192 (default 256; 16 is the load benchmark's
#                     16 x 16 pipelined, 1 its 64 x 1)
# CORE_BENCH_BINARY   `cargo bench --bench core`'s executable (default: built
#                     here with `cargo bench --bench core --no-run`); another
#                     commit's, for a before/after
#
# It runs `core -- line` under callgrind twice, with DIVVY_CORE_BATCH=BATCH
# and DIVVY_CORE_ROUNDS of R and 2R batches (R = 8192 / BATCH): both make
# the same 65,536 counters in the same warm-up, so the difference of the two
# totals is 7 x R x BATCH HITs on existing counters, and start-up, warm-up
# and counter creation cancel out. The in-process client (writing batches,
# counting answer lines) is counted too, a small constant share. Needs
# valgrind (callgrind_annotate). About a minute per batch size.
#
# `server` counts a whole server process instead, its user space only (the
# runtime, epoll, the socket calls as seen from user space, the connection
# loop, the decision, the allocator; not the kernel), while CONNECTIONS
# (default 64) connections each keep one HIT in flight: the load benchmark's
# 64 x 1. SERVER is the divvy executable (default: built here with `cargo
# build --profile profiling`; another commit's, for a before/after) or
# `baseline:LOAD` for the load benchmark's constant-answer line server, LOAD
# being `cargo bench --bench load`'s executable. The server runs on CPU 0
# under callgrind, the Python client on CPU 1; the 65,536 actors' counters
# are made first, then the client opens its connections, has each answered
# once, zeroes callgrind's counts, sends 20,000 HITs and dumps the counts,
# which are divided by them. Every answer must be `OK true`.
# KEEP=FILE (environment) keeps the dump, for callgrind_annotate. About a
# minute.
set -euo pipefail

if [ "${1:-}" = server ]; then
  here=$(cd "$(dirname "$0")" && pwd)
  # shellcheck source=benches/callgrind_common.sh
  . "$here/callgrind_common.sh"
  conns=${2:-64}
  server=${3:-}
  if ! [[ "$conns" =~ ^[0-9]+$ ]] || [ "$conns" -lt 1 ] || [ "$conns" -gt 1024 ]; then
    echo "CONNECTIONS must be a whole number from 1 to 1024" >&2
    exit 2
  fi
  init_work
  if [ -z "$server" ]; then
    server=$(profiling_divvy)
  fi
  port=$(free_port)
  if [[ "$server" == baseline:* ]]; then
    # The constant server exits when its stdin closes: a FIFO held open here.
    mkfifo "$work/stdin"
    taskset -c 0 valgrind --tool=callgrind --callgrind-out-file="$work/out.%p" \
      "${server#baseline:}" --baseline-line-server "$port" <"$work/stdin" >"$work/server.log" 2>&1 &
    server_pid=$!
    exec 3>"$work/stdin"
  else
    taskset -c 0 valgrind --tool=callgrind --callgrind-out-file="$work/out.%p" "$server" serve \
      --config "$here/line_policy.yaml" --no-watch --line-addr "127.0.0.1:$port" \
      --grpc-addr "127.0.0.1:$(free_port)" --http-addr "127.0.0.1:$(free_port)" \
      >"$work/server.log" 2>&1 &
    server_pid=$!
  fi
  server_pids+=("$server_pid")
  # CONNS connections, one HIT in flight on each, HITS HITs in all (the load
  # benchmark's request line, the actors in turn). With a PID, callgrind's
  # counts are zeroed once every connection has had its first answer and
  # dumped after the last: a connection's start is not counted.
  cat >"$work/client.py" <<'PY'
import selectors, socket, subprocess, sys

port, conns, hits = (int(a) for a in sys.argv[1:4])
pid = sys.argv[4] if len(sys.argv) > 4 else None
def line(n):
    return b"HIT method=GET path=/api/items ip=10.0.%d.%d\n" % ((n >> 8) & 255, n & 255)
def control(*args):
    out = subprocess.run(["callgrind_control", *args, pid], capture_output=True, text=True).stdout
    if "OK" not in out or "rror" in out:
        sys.exit("callgrind_control %s failed: %s" % (" ".join(args), out))
sel = selectors.DefaultSelector()
socks = []
for _ in range(conns):
    c = socket.create_connection(("127.0.0.1", port))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    socks.append(c)
for i, c in enumerate(socks):
    c.sendall(line(i))
for c in socks:
    answer = b""
    while not answer.endswith(b"\n"):
        answer += c.recv(64)
    if not answer.startswith(b"OK true "):
        sys.exit("unexpected first answer: %r" % answer)
    sel.register(c, selectors.EVENT_READ, bytearray())
if pid:
    control("--zero")
sent = done = 0
for c in socks[:hits]:
    c.sendall(line(sent))
    sent += 1
while done < hits:
    for key, _ in sel.select():
        c, buf = key.fileobj, key.data
        data = c.recv(4096)
        if not data:
            sys.exit("the server closed a connection")
        buf += data
        while b"\n" in buf:
            answer, _, rest = bytes(buf).partition(b"\n")
            buf[:] = rest
            if not answer.startswith(b"OK true "):
                sys.exit("unexpected answer: %r" % answer)
            done += 1
            if sent < hits:
                c.sendall(line(sent))
                sent += 1
if pid:
    control("--dump=counted")
PY
  wait_port "$port" "$server_pid"
  taskset -c 1 python3 "$work/client.py" "$port" "$conns" 65536
  taskset -c 1 python3 "$work/client.py" "$port" "$conns" 20000 "$server_pid"
  total=$(grind_counted_total "$work/out" "$server_pid")
  if [ -n "${KEEP:-}" ]; then cp "$work/out.$server_pid.1" "$KEEP"; fi
  echo "$(basename "${server#baseline:}"), $conns connections x 1 in flight:" \
    "$((total / 20000)) instructions per HIT (20000 HITs counted)"
  exit 0
fi

batch=${1:-256}
binary=${2:-}
if ! [[ "$batch" =~ ^[0-9]+$ ]] || [ "$batch" -lt 1 ] || [ "$batch" -gt 8192 ]; then
  echo "BATCH must be a whole number from 1 to 8192" >&2
  exit 2
fi
# shellcheck source=benches/callgrind_common.sh
. "$(dirname "$0")/callgrind_common.sh"
if [ -z "$binary" ]; then
  cd "$(dirname "$0")/.."
  binary=$(cargo bench --bench core --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\)).*/\1/p' | tail -1)
fi
rounds=$((8192 / batch))

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Total instructions of one `core -- line` run of `rounds` batches a timed run.
instructions() {
  DIVVY_CORE_BATCH=$batch DIVVY_CORE_ROUNDS=$1 valgrind --tool=callgrind \
    --callgrind-out-file="$work/out" "$binary" line >"$work/log" 2>&1
  grind_total "$work/out"
}

low=$(instructions "$rounds")
high=$(instructions $((2 * rounds)))
hits=$((7 * rounds * batch))
echo "line path in-process, $batch HITs a batch: $(((high - low) / hits)) instructions per HIT ($hits HITs counted)"
