# Shared by the benches/*_instructions.sh scripts (sourced, not run): a free
# loopback port, a dump's instruction total, and counting a phase of a
# server's run under callgrind (zero the counts, run the phase, dump them,
# read the total), each step checked, so a failure stops the script rather
# than printing a wrong figure.

# A free TCP port on 127.0.0.1.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# callgrind_control COMMAND PID, failing unless the tool reports success
# (callgrind_control itself exits 0 even when it finds no such process).
grind_control() {
  local out
  out=$(callgrind_control "$1" "$2" 2>&1 || true)
  if ! grep -q "OK" <<<"$out" || grep -qiE "error|no active" <<<"$out"; then
    echo "callgrind_control $1 $2 failed: $out" >&2
    return 1
  fi
}

# The instructions of callgrind dump FILE (callgrind_annotate's program
# total), checked to be a number.
grind_total() {
  local total
  total=$(callgrind_annotate "$1" | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')
  if ! [[ "$total" =~ ^[0-9]+$ ]]; then
    echo "no instruction total in $1" >&2
    return 1
  fi
  echo "$total"
}

# The instructions counted in the dump named `counted` that callgrind wrote
# to OUT_PREFIX.PID.1 (with --callgrind-out-file=OUT_PREFIX.%p), the dump
# checked to be the counted phase's.
grind_counted_total() {
  local dump="$1.$2.1"
  for _ in $(seq 50); do
    [ -s "$dump" ] && grep -q "^summary:" "$dump" && break
    sleep 0.1
  done
  if ! [ -s "$dump" ] || ! grep -q "^desc: Trigger: dump counted" "$dump"; then
    echo "no callgrind dump of the counted phase at $dump" >&2
    return 1
  fi
  grind_total "$dump"
}

# Waits up to two minutes for 127.0.0.1:PORT to accept a connection,
# failing as soon as process PID (the server under callgrind) has exited.
wait_port() {
  local port=$1 pid=$2
  for _ in $(seq 600); do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "the server exited before it listened on $port" >&2
      return 1
    fi
    if python3 -c "import socket; socket.create_connection(('127.0.0.1', $port))" 2>/dev/null; then
      return 0
    fi
    sleep 0.2
  done
  echo "nothing listened on $port within two minutes" >&2
  return 1
}

# divvy's profiling build, built here with cargo; its path. (`here` is the
# sourcing script's directory, benches/.)
profiling_divvy() {
  (cd "$here/.." && cargo build --profile profiling --bin divvy >&2)
  echo "$here/../target/profiling/divvy"
}

# Makes the work directory `work`, removed on exit, when the processes in
# `server_pids` are killed and, if the script failed, the tail of each log
# in it printed.
init_work() {
  work=$(mktemp -d)
  server_pids=()
  trap cleanup EXIT
}
cleanup() {
  local status=$?
  for p in ${server_pids[@]+"${server_pids[@]}"}; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "$status" != 0 ]; then
    for log in "$work"/*.log; do
      [ -f "$log" ] && { echo "--- $log" >&2; tail -20 "$log" >&2; }
    done
  fi
  rm -rf "$work"
}
