#!/usr/bin/env bash
# Instructions redis-server runs per counter in divvy's counter script, counted
# by valgrind's callgrind: unlike CPU time, the count repeats to within about
# 1% for the same binaries and input (the key names and the time differ a
# little), whatever else the machine is doing, so a change to the script can
# be measured to a percent.
#
#   benches/script_instructions.sh [SCRIPT] [ALGORITHM] [HINTS]
#
# SCRIPT     the script (default: the repository's src/store/lua/ pieces
#            joined in the order src/store/algorithm/mod.rs joins them,
#            wherever this is run from); an older one with
#            `git show <commit>:src/store/lua/counters.lua > old.lua`
# ALGORITHM  0 divvy's window (default), 1 fixed, 2 sliding, 3 token bucket;
#            `group`: 30 requests of a rule of two token-bucket limits (its
#            HINTS default to 2: the call is not lone; runs of one key are
#            two values, as scripts before runs took them)
# HINTS      the call's hints, ARGV[3] (default 3: every op a lone counter, no
#            key twice; 2 for `group`); `none` for scripts from before
#            ARGV[3] existed
# PAIRS=1    (environment) the per-key arguments as two values a key, for
#            scripts from before they were sent in runs (implied by
#            HINTS=none); a script that refuses the call stops the run
#
# Each run starts redis-server under callgrind on a free loopback port, loads
# the script, makes every counter once, then runs `redis-benchmark` calls of
# 60 counters (one request each, cost 1, limit 10^9, window 1 h; for
# `group`, 30 requests of two) on existing counters; it is done for 100
# and for 300 calls, and the difference is divided by 200 x 60, so start-up and loading cancel out.
# (A token bucket of 10^9 an hour holding one credit's use is full again,
# and its key gone, 1 ms later: ALGORITHM 3 and `group` count new buckets.)
# Needs valgrind (callgrind_annotate), redis-server, redis-cli,
# redis-benchmark and python3 (for a free port). About 10 s.
set -euo pipefail

joined=""
if [ -n "${1:-}" ]; then
  script=$1
else
  lua=$(dirname "$0")/../src/store/lua
  script=$(mktemp)
  joined=$script
  cat "$lua"/prelude.lua "$lua"/window.lua "$lua"/fixed.lua "$lua"/sliding.lua \
    "$lua"/token_bucket.lua "$lua"/lone.lua "$lua"/driver.lua >"$script"
fi
algorithm=${2:-0}
if [ "$algorithm" = group ]; then hints=${3:-2}; else hints=${3:-3}; fi
if [ "$algorithm" = group ] && [ "$hints" != none ] && [ $((hints % 2)) = 1 ]; then
  echo "a group's call is not lone: HINTS must be even (or none)" >&2
  exit 2
fi
counters=60

keys=()
if [ "$algorithm" = group ]; then
  # 30 requests of one rule's two limits (token buckets, by ip and by user):
  # the second of each is in the first's group (flag 1), so no two
  # neighbours share a run. Hints: no key twice (2), not lone.
  for i in $(seq 1 30); do keys+=("divvy:bench:ip=10.0.$i.7" "divvy:bench:user=u$i"); done
  args=(-1 2)
  [ "$hints" = none ] || args+=("$hints")
  # (bursts within divvy's bound: burst x window ms <= 2^52)
  args+=(3 1000000000 3600000 1000000000 3 1200000000 3600000 1200000000)
  # shape 1 * 128 + flags 4, cost 1; shape 2 * 128 + flags 1, cost 1
  for _ in $(seq 1 30); do args+=(132 1 257 1); done
else
  for i in $(seq 1 "$counters"); do keys+=("divvy:bench:ip=10.0.$i.7"); done
  args=(-1 1)
  [ "$hints" = none ] || args+=("$hints")
  args+=("$algorithm" 1000000000 3600000 1000000000)
  # One run of every counter (its head, (how many - 1) * 2^32 + shape 1 *
  # 128 + flags 4, and cost 1), as the store sends a connection's pipelined
  # HITs; `PAIRS=1` sends the older two values a key (shape and flags,
  # cost), for scripts from before the runs.
  if [ "${PAIRS:-0}" = 1 ] || [ "$hints" = none ]; then
    for _ in $(seq 1 "$counters"); do args+=(132 1); done
  else
    args+=($(((counters - 1) * 4294967296 + 132)) 1)
  fi
fi

# shellcheck source=benches/callgrind_common.sh
. "$(dirname "$0")/callgrind_common.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"; [ -z "$joined" ] || rm -f "$joined"' EXIT

# Total instructions of a redis-server that ran `calls` script calls.
instructions() {
  local calls=$1 port pid sha
  port=$(free_port)
  valgrind --tool=callgrind --callgrind-out-file="$work/out" \
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
    >"$work/log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && break
    sleep 0.2
  done
  sha=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$script")")
  # The first call's answer is checked: a script that errors (arguments of
  # the wrong form for it) would otherwise be timed on its error path.
  local first
  first=$(redis-cli -p "$port" EVALSHA "$sha" "$counters" "${keys[@]}" "${args[@]}" 2>&1)
  case "$first" in
    *ERR*) echo "the script refused the call: $first" >&2
           redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
           exit 1 ;;
  esac
  redis-benchmark -p "$port" -c 1 -n "$calls" -q EVALSHA "$sha" "$counters" "${keys[@]}" "${args[@]}" >/dev/null
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$pid" || true
  grind_total "$work/out"
}

low=$(instructions 100)
high=$(instructions 300)
echo "$script, algorithm $algorithm, hints $hints: $(( (high - low) / (200 * counters) )) instructions per counter"
