#!/usr/bin/env bash
# Starts a highly available pdgate setup on this machine: Redis (shared
# instance registry and conversations), pdgate-sim engines (1 prefill,
# 2 decode), two pdgate replicas, and HAProxy in front of them. It then
# runs a two-turn conversation through HAProxy (each turn on another
# replica) to show multi-turn KV reuse shared through Redis.
#   examples/ha/run.sh [BUILD_DIR]      (default: ./build)
#   DEMO_ONLY=1 examples/ha/run.sh      (stop after the demo)
# Then: curl localhost:8000/v1/chat/completions ... ; Ctrl-C stops all.
# Needs redis-server and haproxy (apt-get install -y redis-server haproxy).
set -euo pipefail
BUILD=${1:-build}
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
FRONT_PORT=${FRONT_PORT:-8000}
REDIS_PORT=${REDIS_PORT:-6390}
# start() runs in a command substitution (a subshell), so pids go to a
# file rather than a variable.
PIDFILE="$WORK/pids"
: > "$PIDFILE"
cleanup() {
  while read -r p; do kill "$p" 2>/dev/null || true; done < "$PIDFILE"
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

# Starts a process printing "listening on http://H:P" and echoes P.
start() {
  local name=$1; shift
  "$@" > "$WORK/$name.out" 2> "$WORK/$name.log" &
  echo $! >> "$PIDFILE"
  for _ in $(seq 100); do
    if grep -q "listening on" "$WORK/$name.out" 2>/dev/null; then
      head -1 "$WORK/$name.out" | sed 's/.*://'
      return
    fi
    sleep 0.1
  done
  echo "$name did not start; see $WORK/$name.log" >&2
  exit 1
}

redis-server --port "$REDIS_PORT" --save '' --appendonly no > "$WORK/redis.log" 2>&1 &
echo $! >> "$PIDFILE"
P=$(start prefill "$BUILD/pdgate-sim" --role prefill --port 0)
# --issue-decode-kv: like vLLM engines configured for bidirectional KV
# transfer, a decode that finishes a turn hands out params for its blocks,
# which the next turn's prefill reads instead of recomputing the history.
D1=$(start decode1 "$BUILD/pdgate-sim" --role decode --port 0 --issue-decode-kv)
D2=$(start decode2 "$BUILD/pdgate-sim" --role decode --port 0 --issue-decode-kv)
export ADMIN_API_KEY=${ADMIN_API_KEY:-change-me}
COMMON=(--host 127.0.0.1 --prefill "127.0.0.1:$P" --decode "127.0.0.1:$D1" "127.0.0.1:$D2"
        --redis "redis://127.0.0.1:$REDIS_PORT" --admin-port 0)
GW1=$(start gw1 "$BUILD/pdgate" --port 0 "${COMMON[@]}")
GW2=$(start gw2 "$BUILD/pdgate" --port 0 "${COMMON[@]}")
sed -e "s/@FRONT_PORT@/$FRONT_PORT/" -e "s/@GW1_PORT@/$GW1/" -e "s/@GW2_PORT@/$GW2/" \
  "$HERE/haproxy.cfg.in" > "$WORK/haproxy.cfg"
haproxy -f "$WORK/haproxy.cfg" -db > "$WORK/haproxy.log" 2>&1 &
echo $! >> "$PIDFILE"
echo "pdgate HA: http://127.0.0.1:$FRONT_PORT (replicas :$GW1 and :$GW2; engines :$P :$D1 :$D2)"
echo "logs in $WORK; Ctrl-C stops everything"

# Multi-turn reuse across replicas. Turn 2 resends turn 1's messages and
# answer (the history must match exactly, and the same credential must ask:
# docs/conversations.md). HAProxy alternates replicas, so turn 2 is served
# by the other replica, which finds turn 1's params in Redis.
for _ in $(seq 50); do
  curl -sf "http://127.0.0.1:$FRONT_PORT/readyz" > /dev/null && break
  sleep 0.1
done
ask() {
  curl -sS -H 'Authorization: Bearer demo-user' -H 'Content-Type: application/json' \
    "http://127.0.0.1:$FRONT_PORT/v1/chat/completions" -d "$1"
}
TURN1='{"model":"sim-model","conversation_id":"demo-1","max_tokens":8,
        "messages":[{"role":"user","content":"Tell me about disaggregated serving."}]}'
ANSWER=$(ask "$TURN1" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["choices"][0]["message"]["content"]))')
TURN2='{"model":"sim-model","conversation_id":"demo-1","max_tokens":8,
        "messages":[{"role":"user","content":"Tell me about disaggregated serving."},
                    {"role":"assistant","content":'"$ANSWER"'},
                    {"role":"user","content":"And why share the KV cache?"}]}'
ask "$TURN2" > /dev/null
hits=0
for port in "$GW1" "$GW2"; do
  n=$(curl -s "http://127.0.0.1:$port/metrics" |
      awk '/^pdgate_conversation_cache_hits_total/ {s += $2} END {print s + 0}')
  hits=$((hits + n))
done
echo "multi-turn demo: turn 2 reused turn 1's KV blocks: $([ "$hits" -ge 1 ] && echo yes || echo NO) (conversation cache hits across replicas: $hits)"
[ "${DEMO_ONLY:-0}" = 1 ] && { [ "$hits" -ge 1 ]; exit $?; }

# Health check for a load balancer in front of the replicas: GET /health
# on each replica's client port (see haproxy.cfg.in).
wait
