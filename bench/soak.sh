#!/usr/bin/env bash
# Soak: pdgate in front of 2 prefill + 2 decode pdgate-sim engines, a
# thousand streaming clients for ten minutes, while one decode engine is
# killed (SIGKILL) and restarted on the same port every 30 seconds.
# Unless --no-hostile, two hostile inputs run all along (issue 32): a
# KV-event publisher for the second prefill whose sequence numbers go
# backwards every 5 ms and whose replay socket never answers, and a
# writer that poisons the shared registry in Redis every 3 s (a 1.5 MB
# label, the command-line decodes marked removed, 5,000 dead entries
# outside --allowed-upstreams, a document that is not JSON, one of 17 MiB).
# Reports requests served, failures by kind, hung requests (any request
# running past the bound the gateway's timeouts set), and the gateway's
# RSS and open file descriptors over time.
#
#   bench/soak.sh [--minutes 10] [--concurrency 1000] [--kill-every 30] [--build build]
#                 [--no-hostile]
#
# Not run by CI (it takes the whole machine for its duration); results and
# their reading are in bench/README.md ("Soak").
set -euo pipefail

minutes=10
concurrency=1000
kill_every=30
BUILD=build
hostile=1
while (($#)); do
  case "$1" in
    --minutes) minutes=$2; shift ;;
    --concurrency) concurrency=$2; shift ;;
    --kill-every) kill_every=$2; shift ;;
    --build) BUILD=$2; shift ;;
    --no-hostile) hostile=0 ;;
    *) echo "soak.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
ninja -C "$BUILD" pdgate pdgate-sim pdgate-loadgen > /dev/null

WORK=$(mktemp -d)
PIDS="$WORK/pids"
: > "$PIDS"
cleanup() {
  while read -r p; do kill -9 "$p" 2>/dev/null || true; done < "$PIDS"
  [[ -n ${KILLER:-} ]] && kill "$KILLER" 2>/dev/null || true
  [[ -n ${SAMPLER:-} ]] && kill "$SAMPLER" 2>/dev/null || true
  [[ -n ${POISONER:-} ]] && kill "$POISONER" 2>/dev/null || true
}
trap cleanup EXIT
# Each stream holds a client and an engine connection: raise the limit as
# far as allowed (1,000 streams need ~2,100 descriptors).
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# Starts a process that prints "listening on http://H:P"; echoes its pid
# and port ("PID PORT").
start() {
  local name=$1; shift
  "$@" > "$WORK/$name.out" 2>> "$WORK/$name.log" &
  local pid=$!
  echo "$pid" >> "$PIDS"
  for _ in $(seq 100); do
    if grep -q "listening on" "$WORK/$name.out" 2>/dev/null; then
      echo "$pid $(head -1 "$WORK/$name.out" | sed 's/.*://')"
      return
    fi
    sleep 0.1
  done
  echo "$name did not start: $(tail -3 "$WORK/$name.log")" >&2
  exit 1
}

# Engines sized so the gateway, not the engines' queues, is what is
# soaked: no request waits for a slot. A stream is 40 tokens ~40 ms apart.
SIM_COMMON=(--max-num-seqs 4096 --max-waiting 100000 --prefill-lanes 0 --prefill-base-ms 1
            --prefill-us-per-token 5 --log-level warn)
read -r _ P1 < <(start p1 "$BUILD/pdgate-sim" --role prefill --port 0 "${SIM_COMMON[@]}")
read -r _ P2 < <(start p2 "$BUILD/pdgate-sim" --role prefill --port 0 "${SIM_COMMON[@]}")
DECODE_ARGS=(--role decode --itl-ms 40 "${SIM_COMMON[@]}")
read -r D1PID D1 < <(start d1 "$BUILD/pdgate-sim" --port 0 "${DECODE_ARGS[@]}")
read -r D2PID D2 < <(start d2 "$BUILD/pdgate-sim" --port 0 "${DECODE_ARGS[@]}")

# The bound a request may take: the first-byte timeout (which also bounds
# every silence inside a stream) plus a stream's own length, with margin.
FIRST_BYTE=30
BOUND=$((FIRST_BYTE * 2 + 30))
HOSTILE_ARGS=()
if ((hostile)); then
  # A Redis for the shared registry, on a free port.
  REDIS_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    > "$WORK/redis.log" 2>&1 &
  echo $! >> "$PIDS"
  for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping > /dev/null 2>&1 && break; sleep 0.1; done
  # The hostile KV-event publisher (tests/integration/kv_event_publisher.py).
  read -r _ KVP < <(start kvpub /usr/bin/python3 tests/integration/kv_event_publisher.py)
  EP=$(curl -s "http://127.0.0.1:$KVP/endpoints")
  PUB=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["pub"])' "$EP")
  REPLAY=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["replay"])' "$EP")
  # The engines' network is on the allow-list, as an operator sets it;
  # the writer's 5,000 dead entries are elsewhere (127.0.0.2).
  HOSTILE_ARGS=(--redis "redis://127.0.0.1:$REDIS_PORT" --tokenizer sim
                --allowed-upstreams 127.0.0.1/32
                --kv-events "http://127.0.0.1:$P2=$PUB,replay=$REPLAY")
fi
read -r GWPID GW < <(start gw "$BUILD/pdgate" --host 127.0.0.1 --port 0 --workers 2 \
  --prefill "127.0.0.1:$P1" "127.0.0.1:$P2" --decode "127.0.0.1:$D1" "127.0.0.1:$D2" \
  --first-byte-timeout "${FIRST_BYTE}s" --connect-timeout 2s --health-interval 1s \
  "${HOSTILE_ARGS[@]}" --log-level warn)
echo "soak: pdgate pid $GWPID on :$GW; prefill :$P1 :$P2; decode :$D1 :$D2; work dir $WORK"

# Every kill_every seconds: SIGKILL one decode (alternating) and restart it
# on the same port at once.
(
  n=0
  while sleep "$kill_every"; do
    n=$((n + 1))
    if ((n % 2)); then victim=d1 port=$D1; else victim=d2 port=$D2; fi
    pid=$(cat "$WORK/$victim.pid" 2>/dev/null || true)
    [[ -z $pid ]] && pid=$([[ $victim == d1 ]] && echo "$D1PID" || echo "$D2PID")
    kill -9 "$pid" 2>/dev/null || true
    echo "$(date +%s) killed $victim ($pid)" >> "$WORK/kills.log"
    for _ in $(seq 50); do
      "$BUILD/pdgate-sim" --port "$port" "${DECODE_ARGS[@]}" > /dev/null 2>> "$WORK/$victim.log" &
      newpid=$!
      sleep 0.2
      if kill -0 "$newpid" 2>/dev/null; then break; fi
    done
    echo "$newpid" > "$WORK/$victim.pid"
    echo "$newpid" >> "$PIDS"
  done
) 2> /dev/null &
KILLER=$!

POISONER=""
if ((hostile)); then
  curl -s -X POST -d '{"interval_ms": 5}' "http://127.0.0.1:$KVP/hostile" > /dev/null
  # Every 3 s, the next of five poisoned registry documents, announced as
  # a registry change is (the version bumped and published).
  (
    python3 - "$WORK" "$D1" "$D2" <<'PY'
import json, sys
work, d1, d2 = sys.argv[1:]
def entry(url, **kw):
    e = {"role": "decode", "url": url, "labels": {}, "weight": 1, "state": "active"}
    e.update(kw)
    return e
docs = [
    {"decode|http://127.0.0.1:1": entry("http://127.0.0.1:1", labels={"blob": "x" * 1500000})},
    {f"decode|http://127.0.0.1:{p}": entry(f"http://127.0.0.1:{p}", state="removed")
     for p in (d1, d2)},
    {f"decode|http://127.0.0.2:{p}": entry(f"http://127.0.0.2:{p}") for p in range(20000, 25000)},
]
for i, d in enumerate(docs):
    open(f"{work}/poison{i}.json", "w").write(json.dumps(d))
open(f"{work}/poison3.json", "w").write("this is not json {")
open(f"{work}/poison4.json", "w").write(json.dumps({"junk": "j" * (17 << 20)}))
PY
    n=0
    while sleep 3; do
      redis-cli -p "$REDIS_PORT" -x SET pdgate:instances < "$WORK/poison$((n % 5)).json" > /dev/null
      v=$(redis-cli -p "$REDIS_PORT" INCR pdgate:instances:version)
      redis-cli -p "$REDIS_PORT" PUBLISH pdgate:instances:changed "$v" > /dev/null
      n=$((n + 1))
      echo "$n" > "$WORK/poisoned.count"
    done
  ) 2> "$WORK/poisoner.log" &
  POISONER=$!
fi

# Every 10 s: the gateway's RSS (KiB) and open descriptors.
(
  t0=$(date +%s)
  while kill -0 "$GWPID" 2>/dev/null; do
    rss=$(awk '/^VmRSS/ {print $2}' "/proc/$GWPID/status")
    fds=$(ls "/proc/$GWPID/fd" | wc -l)
    echo "$(($(date +%s) - t0)) $rss $fds" >> "$WORK/samples.tsv"
    sleep 10
  done
) &
SAMPLER=$!

"$BUILD/pdgate-loadgen" --url "http://127.0.0.1:$GW" --chat --stream \
  --concurrency "$concurrency" --duration $((minutes * 60)) --warmup 0 --max-tokens 40 \
  --prompt-bytes 256 --request-timeout "$BOUND" --label soak --json > "$WORK/loadgen.json"

kill "$KILLER" "$SAMPLER" ${POISONER:+"$POISONER"} 2>/dev/null || true
KILLER="" SAMPLER="" POISONER=""
alive=yes
kill -0 "$GWPID" 2>/dev/null || alive=no
if ((hostile)) && [[ $alive == yes ]]; then
  {
    echo "poisoned registry writes: $(cat "$WORK/poisoned.count" 2>/dev/null || echo 0)"
    curl -s "http://127.0.0.1:$GW/metrics" | grep -E '^pdgate_(shared_registry_document_errors_total|shared_instances_refused_total|kv_events_(restarts|replays)_total|kv_events_state)' || true
  } > "$WORK/hostile.txt"
fi
kills=$(wc -l < "$WORK/kills.log" 2>/dev/null || echo 0)

python3 - "$WORK" "$minutes" "$concurrency" "$kill_every" "$BOUND" "$alive" "$kills" <<'PY'
import json, sys
work, minutes, conc, every, bound, alive, kills = sys.argv[1:]
r = json.load(open(f"{work}/loadgen.json"))
samples = [tuple(map(int, l.split())) for l in open(f"{work}/samples.tsv") if l.strip()]
hung = r["failures"].get("timeout", 0)
fails = r["errors"]
print(f"## Soak: {minutes} min, {conc} concurrent streams, a decode killed every {every} s")
print()
print(f"- requests served (200, complete stream): {r['ok']}  ({r['rps']:.0f}/s)")
print(f"- failed: {fails} ({100.0 * fails / max(1, r['ok'] + fails):.2f}%), by kind: {json.dumps(r['failures'])}")
print(f"- hung (still running after {bound} s): {hung}; longest request: {r['max_e2e_ms'] / 1000:.1f} s")
print(f"- decode kills: {kills}; gateway alive at the end: {alive}")
print(f"- TTFT p50/p99: {r['ttft_p50']:.0f}/{r['ttft_p99']:.0f} ms; ITL p50/p99: {r['itl_p50']:.0f}/{r['itl_p99']:.0f} ms")
if samples:
    rss = [s[1] for s in samples]; fds = [s[2] for s in samples]
    mid = len(samples) // 2
    print(f"- gateway RSS: first {rss[0]/1024:.0f} MiB, middle {rss[mid]/1024:.0f} MiB, last {rss[-1]/1024:.0f} MiB, max {max(rss)/1024:.0f} MiB")
    print(f"- gateway fds: first {fds[0]}, middle {fds[mid]}, last {fds[-1]}, max {max(fds)}")
    print()
    print("t(s) rss(KiB) fds: " + "; ".join(f"{t} {m} {f}" for t, m, f in samples))
import os
if os.path.exists(f"{work}/hostile.txt"):
    print()
    print("Hostile inputs, as the gateway counted them at the end:")
    print()
    for line in open(f"{work}/hostile.txt"):
        print(f"    {line.rstrip()}")
PY
