#!/usr/bin/env bash
# Two or more pdgate binaries against each other on the Redis-heavy path:
# multi-turn chat conversations through prefill and decode (pdgate-sim,
# decode issuing its KV params), every turn a GETDEL and a SET of the
# conversation store, with the shared registry, the load sharing and the
# KV-location index talking to the same redis-server meanwhile. Each round
# runs every binary in turn; the gateway's CPU per request is read from
# /proc (all its threads), so a busy machine slows each run but skews the
# ratio less.
#
#   bench/redis_ab.sh BINARY [BINARY...]
#
# Environment: ROUNDS (5), SECONDS_PER_RUN (4), CONCURRENCY (8), TURNS (4),
# LOADGEN (build/pdgate-loadgen), SIM (build/pdgate-sim). Prints, per round
# and binary, the requests answered, the conversation-store hits and the
# gateway's CPU per request; then each binary's median ratio to the first.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
(($# >= 1)) || { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
rounds=${ROUNDS:-5}
secs=${SECONDS_PER_RUN:-4}
conc=${CONCURRENCY:-8}
turns=${TURNS:-4}
lg=${LOADGEN:-$root/build/pdgate-loadgen}
sim=${SIM:-$root/build/pdgate-sim}
for b in "$lg" "$sim" "$@"; do [[ -x $b ]] || { echo "not an executable: $b" >&2; exit 1; }; done

tmp=$(mktemp -d /tmp/pdgate-redis-ab.XXXXXX)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# listening_port FILE: the port a process announced on its stdout.
listening_port() {
  local p="" _
  for _ in $(seq 200); do
    p=$(sed -n 's/.*listening on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$1" | head -1)
    [[ -n $p ]] && break
    sleep 0.05
  done
  [[ -n $p ]] || { echo "no listening line in $1:" >&2; cat "$1" >&2; exit 1; }
  echo "$p"
}
# CPU time (ns) a process has used, all its threads.
cpu_ns() {
  local f a s=0
  for f in /proc/"$1"/task/*/schedstat; do
    read -r a _ <"$f" && s=$((s + a))
  done
  echo "$s"
}

rp=$(free_port)
redis-server --port "$rp" --bind 127.0.0.1 --save '' --appendonly no --loglevel warning \
  >"$tmp/redis.out" 2>&1 &
pids+=($!)
"$sim" --role prefill --port 0 >"$tmp/prefill.out" 2>&1 &
pids+=($!)
"$sim" --role decode --port 0 --issue-decode-kv --itl-ms 0 >"$tmp/decode.out" 2>&1 &
pids+=($!)
pp=$(listening_port "$tmp/prefill.out")
dp=$(listening_port "$tmp/decode.out")

declare -A cpu
for r in $(seq "$rounds"); do
  i=0
  for b in "$@"; do
    out=$tmp/gw$i.out
    "$b" --host 127.0.0.1 --port 0 --workers 1 --log-level error --health-interval off \
      --metrics-interval off --prefill "127.0.0.1:$pp" --decode "127.0.0.1:$dp" \
      --redis "redis://127.0.0.1:$rp" --redis-timeout 200ms >"$out" 2>&1 &
    pid=$!
    port=$(listening_port "$out")
    sleep 1  # connected to Redis
    c0=$(cpu_ns "$pid")
    line=$("$lg" --url "http://127.0.0.1:$port" --chat --turns "$turns" --concurrency "$conc" \
      --duration "$secs" --warmup 0 --max-tokens 4 --json)
    c1=$(cpu_ns "$pid")
    n=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["ok"])' "$line")
    hits=$(curl -s "http://127.0.0.1:$port/metrics" |
      sed -n 's/^pdgate_conversation_cache_hits_total \([0-9]*\).*/\1/p')
    us=$(((c1 - c0) / 1000 / (n > 0 ? n : 1)))
    cpu[$r,$i]=$us
    echo "round $r binary $i: $n requests, $hits conversation hits, $us us CPU per request"
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    i=$((i + 1))
  done
done
for ((i = 1; i < $#; i++)); do
  ratios=""
  for r in $(seq "$rounds"); do ratios+=" $(python3 -c "print(${cpu[$r,$i]} / ${cpu[$r,0]})")"; done
  python3 -c '
import statistics, sys
v = sorted(float(x) for x in sys.argv[2:])
print("binary %s / binary 0: median %.3f (%.3f-%.3f)" % (sys.argv[1], statistics.median(v), v[0], v[-1]))
' "$i" $ratios
done
