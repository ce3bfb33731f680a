#!/usr/bin/env bash
# Instructions per HIT of the line-protocol path in-process (framing,
# parsing, matching, the memory store, answering; no kernel), counted by
# valgrind's callgrind: unlike CPU time, the count repeats to within about a
# percent whatever else the machine is doing, so a change to the path can be
# measured to a percent.
#
#   benches/line_instructions.sh [BATCH] [CORE_BENCH_BINARY]
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
set -euo pipefail

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
