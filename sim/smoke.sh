#!/usr/bin/env bash
# Manual smoke test of pdgate-sim's P/D handshake (see docs/sim.md):
#   1. start a prefill and a decode sim on ephemeral ports;
#   2. prefill request (kv_transfer_params do_remote_decode) -> params back;
#   3. streaming decode request with those params: tokens arrive one by one,
#      /sim/stats on the decode shows kv_params_total.valid == 1;
#   4. the same params again -> reused == 1;
#   5. a client closing mid-stream shows up as "aborted" in /sim/requests.
# Usage: sim/smoke.sh [path/to/pdgate-sim]   (default: build/pdgate-sim)
# Needs curl and python3. Exits non-zero on the first failed check.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
bin="${1:-${PDGATE_SIM:-$here/../build/pdgate-sim}}"
[[ -x "$bin" ]] || { echo "pdgate-sim binary not found at $bin (build it first)" >&2; exit 2; }

tmp="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() { echo "SMOKE FAIL: $*" >&2; for f in "$tmp"/*.err; do echo "== $f" >&2; cat "$f" >&2; done; exit 1; }
ok() { echo "ok: $*"; }
# json_get '<python expression over j>' < json
json_get() { python3 -c "import json,sys; j=json.load(sys.stdin); print($1)"; }

# start_sim NAME ARGS... : starts a sim, waits for its listening line, sets
# the variable NAME_port.
start_sim() {
  local name="$1"; shift
  "$bin" "$@" --port 0 >"$tmp/$name.out" 2>"$tmp/$name.err" &
  pids+=($!)
  for _ in $(seq 1 100); do
    if grep -q '^pdgate-sim listening on http://' "$tmp/$name.out" 2>/dev/null; then
      local port
      port="$(sed -n 's#^pdgate-sim listening on http://.*:\([0-9]*\)$#\1#p' "$tmp/$name.out")"
      printf -v "${name}_port" '%s' "$port"
      echo "$name sim: $(cat "$tmp/$name.out")"
      return 0
    fi
    sleep 0.05
  done
  fail "$name sim did not start"
}

start_sim prefill --role prefill --itl-ms 10
start_sim decode --role decode --itl-ms 100
P="http://127.0.0.1:$prefill_port"
D="http://127.0.0.1:$decode_port"

prompt="$(printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..20})"

# --- 2. prefill -------------------------------------------------------------
prefill_body=$(cat <<EOF
{"model":"sim-model","prompt":"$prompt","max_tokens":1,"stream":false,
 "kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,
  "remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}
EOF
)
resp="$(curl -sS -H 'X-Request-Id: smoke-1' -H 'Content-Type: application/json' \
  "$P/v1/completions" -d "$prefill_body")"
echo "prefill response: $resp"
kv="$(echo "$resp" | json_get 'json.dumps(j["kv_transfer_params"])')"
[[ "$(echo "$kv" | json_get 'j["do_remote_prefill"]')" == "True" ]] || fail "prefill returned no kv params"
[[ "$(echo "$kv" | json_get 'j["remote_port"]')" == "$prefill_port" ]] || fail "remote_port is not the prefill's port"
ok "prefill issued kv_transfer_params"

# --- 3. streaming decode ------------------------------------------------------
decode_body="{\"model\":\"sim-model\",\"prompt\":\"$prompt\",\"max_tokens\":5,\"stream\":true,
 \"stream_options\":{\"include_usage\":true},\"kv_transfer_params\":$kv}"
echo "decode stream (one line per event, with arrival time):"
curl -sS -N -H 'X-Request-Id: smoke-1' -H 'Content-Type: application/json' "$D/v1/completions" \
  -d "$decode_body" | while IFS= read -r line; do
  if [[ -n "$line" ]]; then printf '  %s  %.110s\n' "$(date +%T.%3N)" "$line"; fi
done | tee "$tmp/stream.txt"
events="$(grep -c '^  .*data: ' "$tmp/stream.txt" || true)"
[[ "$events" == 7 ]] || fail "expected 7 data events (5 tokens, usage, [DONE]), got $events"
grep -q 'data: \[DONE\]' "$tmp/stream.txt" || fail "stream did not end with [DONE]"
stats="$(curl -sS "$D/sim/stats")"
[[ "$(echo "$stats" | json_get 'j["kv_params_total"]["valid"]')" == 1 ]] || fail "decode stats: valid != 1: $stats"
ok "decode pulled the KV (kv_params_total.valid = 1) and streamed tokens"

# --- 4. the same params again -> reused ----------------------------------------
curl -sS -H 'Content-Type: application/json' "$D/v1/completions" \
  -d "{\"prompt\":\"$prompt\",\"max_tokens\":2,\"kv_transfer_params\":$kv}" >/dev/null
stats="$(curl -sS "$D/sim/stats")"
[[ "$(echo "$stats" | json_get 'j["kv_params_total"]["reused"]')" == 1 ]] || fail "decode stats: reused != 1: $stats"
ok "resent params were detected as reused (kv_params_total.reused = 1)"

# --- 5. client disconnect mid-stream ------------------------------------------
curl -sS -N -H 'X-Request-Id: smoke-abort' "$D/v1/completions" \
  -d '{"prompt":"hello","max_tokens":200,"stream":true}' >/dev/null 2>&1 &
curl_pid=$!
sleep 0.4
kill "$curl_pid" 2>/dev/null || true
wait "$curl_pid" 2>/dev/null || true
outcome=""
for _ in $(seq 1 40); do
  outcome="$(curl -sS "$D/sim/requests" |
    json_get '[r["outcome"] for r in j if r["x_request_id"] == "smoke-abort"][0]')"
  [[ "$outcome" == aborted ]] && break
  sleep 0.05
done
[[ "$outcome" == aborted ]] || fail "closed stream recorded as '$outcome', not aborted"
ok "closing the client mid-stream is recorded as aborted"
curl -sS "$D/sim/stats" | json_get '"decode stats: running=%s waiting=%s aborted_total=%s kv=%s" % (j["running"], j["waiting"], j["aborted_total"], j["kv_params_total"])'

echo "SMOKE OK"
