#!/usr/bin/env bash
# The access log's cost on the one-hop request path: user-space
# instructions per request (callgrind, repeatable on a shared machine,
# unlike timings), with --access-log off, then to a file as text and as
# JSON. The gateway's counters are zeroed after a warm-up and dumped
# after the measured requests, so start-up is not counted; every thread
# (the log's writer included) is.
#
#   bench/access_log_cost.sh [BUILD_DIR]      (default: build)
#
# Environment: REQUESTS (2000), CONCURRENCY (4), MAX_TOKENS (4), STREAM
# (1: streamed answers; 0: whole ones), SEPARATE_THREADS (yes: also the
# count of each thread on stderr), KEEP (a directory the callgrind files
# are copied to).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
# shellcheck source=bench/lib.sh
source "$here/lib.sh"



"$build/pdgate-sim" --role both --port 0 --itl-ms 0 --prefill-base-ms 0 \
  --prefill-us-per-token 0 --log-level warn >"$tmp/sim.out" 2>/dev/null &
pids+=($!)
sim_port=$(port_of "$tmp/sim.out")

load=("$build/pdgate-loadgen" --concurrency "$concurrency" --max-tokens "$max_tokens" --warmup 0)
((stream)) && load+=(--stream)

printf '| access log | instructions per request | vs off |\n| --- | --- | --- |\n'
base=""
for mode in off text json; do
  args=(--port 0 --host 127.0.0.1 --workers 1 --decode "127.0.0.1:$sim_port"
    --prefill-servers-urls disable --health-interval off --metrics-interval off --log-level warn)
  [[ $mode != off ]] && args+=(--access-log "$tmp/access-$mode.log" --access-log-format "$mode")
  valgrind --tool=callgrind --separate-threads=${SEPARATE_THREADS:-no} --callgrind-out-file="$tmp/cg.$mode" \
    "$build/pdgate" "${args[@]}" >"$tmp/gw.$mode.out" 2>"$tmp/gw.$mode.err" &
  gw=$!
  pids+=("$gw")
  port=$(port_of "$tmp/gw.$mode.out")
  url="http://127.0.0.1:$port"
  "${load[@]}" --url "$url" --requests 200 >/dev/null
  # The scrapes around the measured requests are measured too: a few
  # thousand instructions, nothing next to $requests requests.
  before=$(answered "http://127.0.0.1:$port")
  callgrind_control -z "$gw" >/dev/null 2>&1
  "${load[@]}" --url "$url" --requests "$requests" >"$tmp/load.$mode.out"
  # The writer takes queued lines every 200 ms: let it write the last ones.
  sleep 2
  callgrind_control -d "$gw" >/dev/null 2>&1
  served=$(($(answered "http://127.0.0.1:$port") - before))
  kill "$gw"
  wait "$gw" 2>/dev/null || true
  # The dump made after the zeroing (cg.MODE.1, or cg.MODE.1-NN per thread
  # with SEPARATE_THREADS=yes) holds the measured requests.
  total=$(cat "$tmp/cg.$mode.1"* | awk '/^summary:/ { n += $2 } END { printf "%d", n }')
  if [[ ${SEPARATE_THREADS:-no} == yes ]]; then
    for f in "$tmp/cg.$mode.1"-*; do
      echo "  $mode thread ${f##*-}: $(awk '/^summary:/ { printf "%d", $2 / '"$served"' }' "$f") per request" >&2
    done
  fi
  per=$((total / served))
  if [[ $mode == off ]]; then
    base=$per
    printf '| off | %d | |\n' "$per"
  else
    lines=$(wc -l <"$tmp/access-$mode.log")
    printf '| %s (%d lines) | %d | %+d (%+.1f%%) |\n' "$mode" "$lines" "$per" "$((per - base))" \
      "$(awk -v a="$per" -v b="$base" 'BEGIN { print (a - b) * 100 / b }')"
  fi
done
