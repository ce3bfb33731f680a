#!/usr/bin/env bash
# Instructions a gRPC server runs per ShouldRateLimit call, its user space
# only (tonic, hyper, h2, the handler, the allocator; not the kernel),
# counted by valgrind's callgrind while h2load (nghttp2-client) sends the
# load benchmark's h2load request (one actor): unlike CPU time, the count
# repeats to about 0.5% whatever else the machine is doing.
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
# KEEP=FILE    (environment) keep callgrind's dump there, for callgrind_annotate
#
# The server runs on one CPU (taskset -c 0: the single-threaded runtime, as in
# the load benchmark) under callgrind; h2load sends 2,000 calls, callgrind's
# counts are zeroed, h2load sends 20,000 more, the counts are dumped and
# divided by them. The request is the benchmark's (one descriptor, path and
# ip, the policy benches/line_policy.yaml). h2load sees HTTP statuses only:
# for divvy the script checks its metrics for 22,000 OK decisions after the
# run (the do-nothing server answers every call with a constant OK). Needs
# valgrind (callgrind_control), h2load and python3. About half a minute.
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
# shellcheck source=benches/callgrind_common.sh
. "$here/callgrind_common.sh"
init_work
if [ -z "$server" ]; then
  server=$(profiling_divvy)
fi

port=$(free_port)
http=

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
server_pids+=("$pid")

wait_port "$port" "$pid"

calls() {
  h2load -n "$1" -c "$connections" -m "$streams" --data="$work/body" \
    -H 'content-type: application/grpc' -H 'te: trailers' \
    "http://127.0.0.1:$port/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" \
    >"$work/h2load.log" 2>&1 || true
  if ! grep -q " $1 done, $1 succeeded," "$work/h2load.log"; then
    echo "h2load: not every call succeeded" >&2
    exit 1
  fi
}

# divvy's OK decisions so far (its metrics); nothing for the baseline.
decided_ok() {
  [ -n "$http" ] || return 0
  python3 - "$http" <<'PY'
import sys, urllib.request
text = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1]).read().decode()
print(int(sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
              if l.startswith("divvy_decisions_total{") and 'code="ok"' in l)))
PY
}

calls 2000
grind_control --zero "$pid"
calls 20000
grind_control --dump=counted "$pid"
total=$(grind_counted_total "$work/out" "$pid")
if [ -n "${KEEP:-}" ]; then cp "$work/out.$pid.1" "$KEEP"; fi
ok=$(decided_ok)
if [ -n "$http" ] && [ "$ok" != 22000 ]; then
  echo "divvy decided $ok calls OK, not the 22000 sent" >&2
  exit 1
fi
echo "gRPC server, $connections connections x $streams calls in flight: $((total / 20000)) instructions per call (20000 calls counted)"
