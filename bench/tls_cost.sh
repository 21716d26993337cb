#!/usr/bin/env bash
# TLS's cost per request on the one-hop path, on both sides at once: a
# client over https to pdgate, and pdgate over https to the engine, against
# the same path in plain HTTP. User-space instructions per request
# (callgrind; repeatable on a shared machine, unlike timings), every thread
# of the gateway counted, after a warm-up, over keep-alive connections (the
# handshakes are paid once per connection and amortised). Then full
# handshakes per second against the gateway (`openssl s_time -new`, no
# session reuse, not under callgrind: a rate on a loaded machine, to be
# read as an order of magnitude).
#
#   bench/tls_cost.sh [BUILD_DIR]      (default: build)
#
# Environment: REQUESTS (2000), CONCURRENCY (4), MAX_TOKENS (4), STREAM
# (1: streamed answers; 0: whole ones), HANDSHAKE_SECONDS (5; 0 skips the
# handshake rate), MODES ("plain tls"; "plain" alone measures a build
# without TLS, e.g. main's, for the plain path's cost before and after).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
# shellcheck source=bench/lib.sh
source "$here/lib.sh"

# Certificates: a CA, and one certificate for localhost/127.0.0.1 that the
# gateway and the engine both serve.
ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
openssl req -x509 "${ec[@]}" -keyout "$tmp/ca.key" -out "$tmp/ca.pem" -days 2 \
  -subj /CN=bench-ca 2>/dev/null
openssl req -new "${ec[@]}" -keyout "$tmp/srv.key" -out "$tmp/srv.csr" -subj /CN=localhost 2>/dev/null
echo "subjectAltName=DNS:localhost,IP:127.0.0.1" >"$tmp/srv.ext"
openssl x509 -req -in "$tmp/srv.csr" -CA "$tmp/ca.pem" -CAkey "$tmp/ca.key" -set_serial 1 \
  -days 2 -extfile "$tmp/srv.ext" -out "$tmp/srv.pem" 2>/dev/null
tls=(--tls-cert "$tmp/srv.pem" --tls-key "$tmp/srv.key")


sim=(--role both --port 0 --itl-ms 0 --prefill-base-ms 0 --prefill-us-per-token 0 --log-level warn)
"$build/pdgate-sim" "${sim[@]}" >"$tmp/sim.out" 2>/dev/null &
pids+=($!)
plain_sim=$(port_of "$tmp/sim.out")
if [[ " ${MODES:-plain tls} " == *" tls "* ]]; then
  "$build/pdgate-sim" "${sim[@]}" "${tls[@]}" >"$tmp/sim-tls.out" 2>/dev/null &
  pids+=($!)
  tls_sim=$(port_of "$tmp/sim-tls.out")
fi

load=("$build/pdgate-loadgen" --concurrency "$concurrency" --max-tokens "$max_tokens" --warmup 0)
((stream)) && load+=(--stream)

printf '| sides | instructions per request | vs plain |\n| --- | --- | --- |\n'
base=""
for mode in ${MODES:-plain tls}; do
  args=(--port 0 --host 127.0.0.1 --workers 1 --prefill-servers-urls disable
    --health-interval off --metrics-interval off --log-level warn)
  if [[ $mode == plain ]]; then
    args+=(--decode "127.0.0.1:$plain_sim")
  else
    args+=(--decode "https://localhost:$tls_sim" --upstream-ca "$tmp/ca.pem" "${tls[@]}")
  fi
  valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.$mode" \
    "$build/pdgate" "${args[@]}" >"$tmp/gw.$mode.out" 2>"$tmp/gw.$mode.err" &
  gw=$!
  pids+=("$gw")
  port=$(port_of "$tmp/gw.$mode.out")
  scheme=http
  [[ $mode == tls ]] && scheme=https
  url="$scheme://localhost:$port"
  "${load[@]}" --url "$scheme://127.0.0.1:$port" --requests 200 >/dev/null
  before=$(answered "$url" --cacert "$tmp/ca.pem")
  callgrind_control -z "$gw" >/dev/null 2>&1
  "${load[@]}" --url "$scheme://127.0.0.1:$port" --requests "$requests" >"$tmp/load.$mode.out"
  callgrind_control -d "$gw" >/dev/null 2>&1
  served=$(($(answered "$url" --cacert "$tmp/ca.pem") - before))
  kill "$gw"
  wait "$gw" 2>/dev/null || true
  total=$(cat "$tmp/cg.$mode.1"* | awk '/^summary:/ { n += $2 } END { printf "%d", n }')
  per=$((total / served))
  if [[ $mode == plain ]]; then
    base=$per
    printf '| plain HTTP both sides | %d | |\n' "$per"
  else
    printf '| TLS both sides | %d | %+d (%.2fx) |\n' "$per" "$((per - base))" \
      "$(awk -v a="$per" -v b="$base" 'BEGIN { print a / b }')"
  fi
done

# Full handshakes (ECDSA P-256 certificate, TLS 1.3, no resumption) a
# one-worker gateway completes per second, s_time's client on the same
# machine.
[[ ${HANDSHAKE_SECONDS:-5} == 0 ]] && exit 0
"$build/pdgate" --port 0 --host 127.0.0.1 --workers 1 --prefill-servers-urls disable \
  --decode "127.0.0.1:$plain_sim" --health-interval off --metrics-interval off --log-level warn \
  "${tls[@]}" >"$tmp/gw.hs.out" 2>/dev/null &
pids+=($!)
port=$(port_of "$tmp/gw.hs.out")
openssl s_time -connect "127.0.0.1:$port" -new -time "${HANDSHAKE_SECONDS:-5}" 2>/dev/null |
  awk '/connections in .* real seconds/ { printf "full handshakes: %s in %s s = %.0f/s (one worker)\n", $1, $4, $1 / $4 }'
