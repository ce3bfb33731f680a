#!/usr/bin/env bash
# Instructions a gRPC server runs per ShouldRateLimit call, its user space
# only (tonic, hyper, h2, the handler, the allocator; not the kernel),
# counted by valgrind's callgrind while h2load (nghttp2-client) sends the
# load benchmark's request: unlike CPU time, the count repeats to within
# about a percent whatever else the machine is doing.
#
#   benches/grpc_instructions.sh [STREAMS] [CONNECTIONS] [SERVER]
#
# STREAMS      calls in flight on each connection (default 32; 1 with one
#              connection is one call at a time, as under light load)
# CONNECTIONS  HTTP/2 connections (default 16: the load benchmark's maximum)
# SERVER       the divvy executable (default: built here with `cargo build
#              --profile profiling`; another commit's, for a before/after), or
#              `baseline:LOAD` for the load benchmark's do-nothing tonic
#              server, LOAD being `cargo bench --bench load`'s executable
#
# The server runs on one CPU (taskset -c 0: the single-threaded runtime, as in
# the load benchmark) under callgrind; h2load sends 2,000 calls, callgrind's
# counts are zeroed, h2load sends 20,000 more, the counts are dumped and
# divided by them. The request is the benchmark's (one descriptor, path and
# ip, the policy benches/line_policy.yaml). Needs valgrind
# (callgrind_control, callgrind_annotate), h2load and python3. About a minute.
set -euo pipefail

streams=${1:-32}
connections=${2:-16}
server=${3:-}
for n in "$streams" "$connections"; do
  if ! [[ "$n" =~ ^[0-9]+$ ]] || [ "$n" -lt 1 ] || [ "$n" -gt 1024 ]; then
    echo "STREAMS and CONNECTIONS must be whole numbers from 1 to 1024" >&2
    exit 2
  fi
done
here=$(cd "$(dirname "$0")" && pwd)
if [ -z "$server" ]; then
  (cd "$here/.." && cargo build --profile profiling --bin divvy >&2)
  server="$here/../target/profiling/divvy"
fi

work=$(mktemp -d)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
port=$(free_port)

# The benchmark's request (domain bench; path=/api/items, ip=10.1.0.0) as a
# gRPC message: protobuf, then the 5-byte frame header.
python3 - "$work/body" <<'PY'
import sys
def field(number, data):
    return bytes([(number << 3) | 2, len(data)]) + data
entries = field(1, field(1, b"path") + field(2, b"/api/items")) + \
          field(1, field(1, b"ip") + field(2, b"10.1.0.0"))
message = field(1, b"bench") + field(2, entries)
open(sys.argv[1], "wb").write(b"\x00" + len(message).to_bytes(4, "big") + message)
PY

grind=(taskset -c 0 valgrind --tool=callgrind --callgrind-out-file="$work/out.%p")
if [[ "$server" == baseline:* ]]; then
  # The baseline serves until its stdin closes: a pipe held open here.
  mkfifo "$work/stdin"
  exec 3<>"$work/stdin"
  "${grind[@]}" "${server#baseline:}" --baseline-grpc-server "$port" <"$work/stdin" >"$work/server.log" 2>&1 &
else
  lines=$(free_port)
  http=$(free_port)
  "${grind[@]}" "$server" serve --config "$here/line_policy.yaml" --no-watch \
    --grpc-addr "127.0.0.1:$port" --line-addr "127.0.0.1:$lines" \
    --http-addr "127.0.0.1:$http" >"$work/server.log" 2>&1 &
fi
pid=$!

for _ in $(seq 300); do
  if python3 -c "import socket; socket.create_connection(('127.0.0.1', $port))" 2>/dev/null; then
    break
  fi
  sleep 0.2
done

calls() {
  h2load -n "$1" -c "$connections" -m "$streams" --data="$work/body" \
    -H 'content-type: application/grpc' -H 'te: trailers' \
    "http://127.0.0.1:$port/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" \
    >"$work/h2load.log" 2>&1 || true
  if ! grep -q "$1 succeeded" "$work/h2load.log"; then
    echo "h2load: not every call succeeded" >&2
    cat "$work/h2load.log" "$work/server.log" >&2
    exit 1
  fi
}
calls 2000
callgrind_control --zero "$pid" >/dev/null 2>&1
calls 20000
callgrind_control --dump=counted "$pid" >/dev/null 2>&1
sleep 0.5
dump=$(ls "$work"/out.*.1 2>/dev/null | head -1)
if [ -z "$dump" ]; then
  echo "no callgrind dump: see the server's log" >&2
  cat "$work/server.log" >&2
  exit 1
fi
total=$(callgrind_annotate "$dump" | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')
echo "gRPC server, $connections connections x $streams calls in flight: $((total / 20000)) instructions per call (20000 calls counted)"
if [ -n "${KEEP:-}" ]; then cp "$dump" "$KEEP"; fi
