#!/usr/bin/env bash
# XpYd with pdgate: 2 prefill + 2 decode engines behind one gateway, the
# deployment of vLLM's disagg_proxy_demo.py.
#
# On GPU machines the engines are `vllm serve` (shown in the comments
# below, one GPU each, NixlConnector moving the KV blocks). Here they are
# pdgate-sim, the simulated engine, so the example runs anywhere. The pdgate
# command line is the same in both cases.
#
# Usage: bash examples/xpyd.sh [--once]
#   --once  send one streamed request, then stop everything
#   (default: keep running until Ctrl-C)
# Needs build/pdgate and build/pdgate-sim (bash scripts/build.sh).
# Environment: MODEL (sim-model), BUILD_DIR (build/), and the ports
# PROXY_PORT (8000), P1_PORT (8100), P2_PORT (8101), D1_PORT (8200),
# D2_PORT (8201) as in vLLM's example.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
MODEL="${MODEL:-sim-model}"
PROXY_PORT="${PROXY_PORT:-8000}"
P1_PORT="${P1_PORT:-8100}" P2_PORT="${P2_PORT:-8101}"
D1_PORT="${D1_PORT:-8200}" D2_PORT="${D2_PORT:-8201}"
once=0
[[ "${1:-}" == --once ]] && once=1

SIM="$BUILD_DIR/pdgate-sim"
PDGATE="$BUILD_DIR/pdgate"
[[ -x "$SIM" && -x "$PDGATE" ]] || { echo "build first: bash scripts/build.sh" >&2; exit 1; }

pids=()
cleanup() {
  trap - EXIT INT TERM
  if ((${#pids[@]})); then kill "${pids[@]}" 2>/dev/null || true; fi
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Waits until something answers on 127.0.0.1:$1, and checks that every
# process started so far is still alive (a port already taken makes the
# newcomer exit at once).
wait_for_port() {
  local ok=0
  for _ in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then ok=1; break; fi
    sleep 0.1
  done
  ((ok)) || { echo "nothing listens on port $1" >&2; return 1; }
  for pid in "${pids[@]}"; do
    kill -0 "$pid" 2>/dev/null || { echo "a process exited (port in use?); see its stderr above" >&2; return 1; }
  done
}

# ---------------------------------------------------------------- prefill
# With vLLM (NixlConnector; each instance on the same host needs its own
# side-channel port):
#
#   CUDA_VISIBLE_DEVICES=0 VLLM_NIXL_SIDE_CHANNEL_PORT=5600 \
#     vllm serve $MODEL --port 8100 --enforce-eager \
#       --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both"}' &
#   CUDA_VISIBLE_DEVICES=1 VLLM_NIXL_SIDE_CHANNEL_PORT=5601 \
#     vllm serve $MODEL --port 8101 --enforce-eager \
#       --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both"}' &
#
# Simulated:
"$SIM" --role prefill --port "$P1_PORT" --model "$MODEL" >/dev/null &
pids+=($!)
"$SIM" --role prefill --port "$P2_PORT" --model "$MODEL" >/dev/null &
pids+=($!)

# ----------------------------------------------------------------- decode
# With vLLM:
#
#   CUDA_VISIBLE_DEVICES=2 VLLM_NIXL_SIDE_CHANNEL_PORT=5602 \
#     vllm serve $MODEL --port 8200 --enforce-eager \
#       --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both"}' &
#   CUDA_VISIBLE_DEVICES=3 VLLM_NIXL_SIDE_CHANNEL_PORT=5603 \
#     vllm serve $MODEL --port 8201 --enforce-eager \
#       --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both"}' &
#
# Simulated (40 ms per token, so streaming is visible):
"$SIM" --role decode --port "$D1_PORT" --model "$MODEL" --itl-ms 40 >/dev/null &
pids+=($!)
"$SIM" --role decode --port "$D2_PORT" --model "$MODEL" --itl-ms 40 >/dev/null &
pids+=($!)

for port in "$P1_PORT" "$P2_PORT" "$D1_PORT" "$D2_PORT"; do wait_for_port "$port"; done

# ------------------------------------------------------------------ proxy
# vLLM's example proxy:
#
#   python3 disagg_proxy_demo.py --model $MODEL \
#     --prefill localhost:8100 localhost:8101 \
#     --decode localhost:8200 localhost:8201 --port 8000
#
# pdgate, same flags:
"$PDGATE" --model "$MODEL" \
  --prefill "localhost:$P1_PORT" "localhost:$P2_PORT" \
  --decode "localhost:$D1_PORT" "localhost:$D2_PORT" \
  --port "$PROXY_PORT" >/dev/null &
pids+=($!)
wait_for_port "$PROXY_PORT"

echo "pdgate on http://127.0.0.1:$PROXY_PORT: 2 prefill ($P1_PORT, $P2_PORT), 2 decode ($D1_PORT, $D2_PORT)"
request=(curl -sS -N --fail-with-body "http://127.0.0.1:$PROXY_PORT/v1/completions"
  -H 'Content-Type: application/json'
  -d '{"model": "'"$MODEL"'", "prompt": "San Francisco is a", "max_tokens": 24, "stream": true}')
echo "\$ ${request[*]}"
"${request[@]}"

((once)) && exit 0
echo
echo "Running; try more requests against http://127.0.0.1:$PROXY_PORT (GET /status). Ctrl-C stops."
wait
