#!/usr/bin/env bash
# Routing quality: replays a request trace (Mooncake JSONL: timestamp,
# input_length, output_length, hash_ids of 512-token blocks) through N
# gateway replicas over K prefill + K decode pdgate-sim engines, once per
# (replica count, traffic, prefill policy), with fresh engines (empty
# caches) and gateways (and Redis, with --redis) each time. Reports per row the prefill
# engines' prefix-cache hit rate (their /metrics: hits / queries, in
# tokens), TTFT p50/p90/p99 and failures, and once the two ceilings
# computed from the trace (bench/trace_ceilings.py).
#
#   bench/routing.sh [--trace FILE | --kind mix [--trace-seconds 60]] [--replicas "1 2 4"]
#                    [--traffic "alternating through-one"]
#                    [--policies "round_robin least_load prefix_affinity cache_aware"]
#                    [--engines 4] [--speed 1] [--limit N] [--kv-tokens 32768]
#                    [--prefill-us-per-token 70] [--itl-ms 5] [--max-tokens 16]
#                    [--decode-policy least_load] [--gateway-arg ARG]... [--redis]
#                    [--kv-events] [--tokenizer sim|vllm]
#                    [--collect-gateway-metrics NAME[,NAME]]... [--repeat 1]
#                    [--build build] [--out DIR]
#
# --trace replays a file as it is (e.g. a public Mooncake trace, if one is
# on disk); without it a synthetic trace is generated (bench/trace_gen.py
# --kind, e.g. mix or hot-prefix; --trace-seconds (60) at 8 requests/s,
# seed 1: longer traces make the tail percentiles steadier).
# --traffic: "alternating" sends the requests alternately to the N
# replicas, as behind a load balancer; "through-one" starts the same N
# replicas (same flags, same Redis) but sends the whole trace to the first
# (the other N-1 idle), so sharing between replicas is separated from CPU
# contention. Default: both for N > 1; with one replica they are the same
# and one row, "alternating", is run. --gateway-arg passes a flag to
# every gateway (repeatable). A policy written PREFILL/DECODE (e.g.
# conditional_pd/conditional_pd) sets the row's decode policy too, instead
# of --decode-policy. --redis starts a fresh redis-server (unix
# socket, no persistence) for each row and gives every gateway `--redis`,
# so the replicas share what pdgate shares through it. --kv-events makes
# every sim publish vLLM's KV cache events and every gateway subscribe to
# them all (--kv-events URL=ENDPOINT,replay=ENDPOINT) with the sim's
# tokenizer (--tokenizer vllm: the engines' POST /tokenize instead), so
# policies see exact cached tokens. --collect-gateway-metrics (repeatable,
# comma separated) reads each gateway's /metrics after the replay and
# puts gateway_metrics {NAME: [value per gateway]} in the row (a series
# name as exposed, its label sets summed; NAME{label="value"} sums only
# those with that label, e.g. pdgate_policy_custom_total{name="leave"};
# null where absent). Each row also has prefill_engines: per prefill
# engine, its prefix-cache queries and hits (tokens) and requests served.
# --repeat K runs the whole matrix K times over (each row tagged `repeat`)
# and, for N > 1 replicas, prints alternating / through-one ratios paired
# within each repeat and their median (bench/routing_ratios.py): a row's
# absolute latencies drift between runs on a shared machine, a pair run
# back to back much less.
# Results: a markdown table on stdout, one JSON line per row in OUT/rows.jsonl.
# Not run by CI (minutes per run; see bench/README.md, "Routing quality").
set -euo pipefail

trace=""
kind=mix
trace_seconds=60
replicas="1 2 4"
traffic=""
gateway_metrics=()
policies="round_robin least_load prefix_affinity cache_aware"
engines=4
speed=1
limit=0
kv_tokens=32768
us_per_token=70
itl_ms=5
max_tokens=16
decode_policy=least_load
gateway_args=()
redis=0
kv_events=0
tokenizer=sim
repeat=1
BUILD=build
OUT=""
while (($#)); do
  case "$1" in
    --trace) trace=$2; shift ;;
    --kind) kind=$2; shift ;;
    --trace-seconds) trace_seconds=$2; shift ;;
    --replicas) replicas=$2; shift ;;
    --traffic) traffic=$2; shift ;;
    --collect-gateway-metrics)
      IFS=, read -r -a names <<< "$2"
      for m in "${names[@]}"; do [[ -z $m ]] || gateway_metrics+=("$m"); done
      shift ;;
    --policies) policies=$2; shift ;;
    --engines) engines=$2; shift ;;
    --speed) speed=$2; shift ;;
    --limit) limit=$2; shift ;;
    --kv-tokens) kv_tokens=$2; shift ;;
    --prefill-us-per-token) us_per_token=$2; shift ;;
    --itl-ms) itl_ms=$2; shift ;;
    --max-tokens) max_tokens=$2; shift ;;
    --decode-policy) decode_policy=$2; shift ;;
    --gateway-arg) gateway_args+=("$2"); shift ;;
    --redis) redis=1 ;;
    --kv-events) kv_events=1 ;;
    --tokenizer) tokenizer=$2; shift ;;
    --repeat) repeat=$2; shift ;;
    --build) BUILD=$2; shift ;;
    --out) OUT=$2; shift ;;
    -h | --help) sed -n '2,52p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "routing.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$(cd "$BUILD" && pwd)
for bin in pdgate pdgate-sim; do
  [[ -x $BUILD/$bin ]] || { echo "routing.sh: $BUILD/$bin missing (build it first)" >&2; exit 2; }
done
for t in $traffic; do
  [[ $t == alternating || $t == through-one ]] ||
    { echo "routing.sh: --traffic takes alternating and/or through-one, not $t" >&2; exit 2; }
done
# The traffic rows for N replicas: --traffic, or both; one replica: one row.
traffic_for() {
  local n=$1
  if ((n == 1)); then echo alternating; return; fi
  echo "${traffic:-alternating through-one}"
}
[[ $repeat =~ ^[1-9][0-9]*$ ]] || { echo "routing.sh: --repeat takes a count of 1 or more" >&2; exit 2; }
# The sims count 16-token KV blocks.
(( kv_tokens >= 16 )) || { echo "routing.sh: --kv-tokens must be at least 16" >&2; exit 2; }
kv_blocks=$((kv_tokens / 16))

WORK=$(mktemp -d)
[[ -n $OUT ]] || OUT=$WORK
mkdir -p "$OUT"
: > "$OUT/rows.jsonl"
PIDS="$WORK/pids"
: > "$PIDS"
stop_all() {
  # Only the processes this script started, each by its pid.
  while read -r p; do kill "$p" 2>/dev/null || true; done < "$PIDS"
  while read -r p; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done < "$PIDS"
  : > "$PIDS"
}
trap 'stop_all; [[ $OUT == "$WORK" ]] || rm -rf "$WORK"' EXIT

# Starts a process that prints "listening on http://H:P"; echoes its port.
start() {
  local name=$1; shift
  # A fresh file: the redirection below happens in the background, so the
  # previous row's file could otherwise still be read here.
  local out
  out=$(mktemp "$WORK/$name.XXXXXX.out")
  LAST_OUT=$out
  "$@" > "$out" 2>> "$WORK/$name.log" &
  echo "$!" >> "$PIDS"
  local port
  for _ in $(seq 100); do
    port=$(grep -m1 "listening on http://" "$out" 2>/dev/null | sed 's/.*://' || true)
    if [[ $port =~ ^[0-9]+$ ]]; then
      echo "$port"
      return
    fi
    sleep 0.1
  done
  echo "routing.sh: $name did not start: $(tail -3 "$WORK/$name.log")" >&2
  exit 1
}

if [[ -z $trace ]]; then
  trace=$WORK/trace-$kind.jsonl
  python3 "$ROOT/bench/trace_gen.py" --kind "$kind" --duration-s "$trace_seconds" --rate 8 --seed 1 > "$trace"
fi
ceil=$(python3 "$ROOT/bench/trace_ceilings.py" "$trace" --limit "$limit" \
  --capacity-tokens $((kv_blocks * 16 * engines)))
echo "trace $trace: $(python3 -c 'import sys; print(sum(1 for l in open(sys.argv[1]) if l.strip()))' "$trace") records, ceilings $ceil" >&2

# engines_json PORT...: per prefill engine, in start order, its prompt
# tokens looked up in its prefix cache, those found there and the requests
# it served ({"queries", "hits", "requests"}): where a policy put the work,
# and, summed, the row's hit rate.
engines_json() {
  python3 - "$@" <<'PY'
import json, sys, urllib.request
names = {"vllm:prefix_cache_queries_total": "queries", "vllm:prefix_cache_hits_total": "hits",
         "vllm:request_success_total": "requests"}
out = []
for port in sys.argv[1:]:
    text = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % port, timeout=10).read().decode()
    e = {v: 0 for v in names.values()}
    for line in text.splitlines():
        key = names.get(line.split("{")[0].split(" ")[0])
        if key:
            e[key] += int(float(line.rsplit(" ", 1)[1]))
    out.append(e)
print(json.dumps(out))
PY
}

# gateway_metrics_json PORT...: {NAME: [value per gateway]} for the names of
# --collect-gateway-metrics, each value the series' label sets summed (those
# holding label="value" for a NAME{label="value"}), null
# where the gateway has no such series or its /metrics could not be read.
gateway_metrics_json() {
  python3 - "${#gateway_metrics[@]}" "${gateway_metrics[@]}" "$@" <<'PY'
import json, math, sys, urllib.request
k = int(sys.argv[1])
names, ports = sys.argv[2:2 + k], sys.argv[2 + k:]
out = {name: [] for name in names}
# NAME{label="value"}: only the label sets holding that label.
wanted = {name: (name.partition("{")[0], name.partition("{")[2].rstrip("}")) for name in names}
for port in ports:
    try:
        text = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % port, timeout=10).read().decode()
    except Exception:
        text = ""
    sums = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series = line.split("{")[0].split(" ")[0]
        labels = line[len(series):].rsplit(" ", 1)[0]
        for name, (base, want) in wanted.items():
            if series != base or (want and "{" + want not in labels and "," + want not in labels):
                continue
            try:
                v = float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
            sums[name] = sums.get(name, 0.0) + v
    for name in names:
        v = sums.get(name)
        out[name].append(v if v is not None and math.isfinite(v) else None)
print(json.dumps(out))
PY
}

sim_events=()
if ((kv_events)); then
  sim_events=(--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
    "endpoint": "tcp://127.0.0.1:*", "replay_endpoint": "tcp://127.0.0.1:*"}')
fi
# With --kv-events: the gateway flag naming the sim just started (its URL,
# then the endpoints its /sim/stats names).
events_flag() {
  local port=$1 ev rp
  read -r ev rp < <(curl -s "http://127.0.0.1:$port/sim/stats" | python3 -c '
import json, sys
e = json.load(sys.stdin).get("kv_events") or {}
print(e.get("endpoint", ""), e.get("replay_endpoint", ""))')
  [[ -n $ev && -n $rp ]] || { echo "routing.sh: sim on $port names no event endpoints" >&2; exit 1; }
  echo "http://127.0.0.1:$port=$ev,replay=$rp"
}

for rep in $(seq "$repeat"); do
  for n in $replicas; do
    for row_traffic in $(traffic_for "$n"); do
      for policy in $policies; do
        pre=() dec=() pports=() ev_args=()
        for k in $(seq "$engines"); do
          start "p$k" "$BUILD/pdgate-sim" --role prefill --log-level warn --kv-blocks "$kv_blocks" \
            --prefill-us-per-token "$us_per_token" --prefill-base-ms 2 --max-model-len 1048576 \
            --max-num-seqs 64 --itl-ms "$itl_ms" "${sim_events[@]}" > "$WORK/port"
          port=$(< "$WORK/port")
          pre+=("127.0.0.1:$port") pports+=("$port")
          if ((kv_events)); then ev_args+=(--kv-events "$(events_flag "$port")"); fi
          start "d$k" "$BUILD/pdgate-sim" --role decode --log-level warn --kv-blocks "$kv_blocks" \
            --prefill-us-per-token "$us_per_token" --prefill-base-ms 2 --max-model-len 1048576 \
            --max-num-seqs 64 --itl-ms "$itl_ms" "${sim_events[@]}" > "$WORK/port"
          port=$(< "$WORK/port")
          dec+=("127.0.0.1:$port")
          if ((kv_events)); then ev_args+=(--kv-events "$(events_flag "$port")"); fi
        done
        row_args=("${gateway_args[@]}" "${ev_args[@]}")
        if ((kv_events)); then row_args+=(--tokenizer "$tokenizer"); fi
        if ((redis)); then
          sock=$(mktemp -u "$WORK/redis.XXXXXX.sock")
          redis-server --port 0 --unixsocket "$sock" --save "" --appendonly no \
            > "$WORK/redis.log" 2>&1 &
          echo "$!" >> "$PIDS"
          for _ in $(seq 100); do [[ -S $sock ]] && break; sleep 0.1; done
          [[ -S $sock ]] || { echo "routing.sh: redis-server did not start" >&2; exit 1; }
          row_args+=(--redis "unix://$sock")
        fi
        # A policy written PREFILL/DECODE sets both for the row (a request hook
        # lives in the decode policy: conditional_pd/conditional_pd).
        row_decode=$decode_policy
        [[ $policy != */* ]] || row_decode=${policy#*/}
        urls=() gports=()
        for r in $(seq "$n"); do
          port=$(start "g$r" "$BUILD/pdgate" --host 127.0.0.1 --port 0 --workers 1 --log-level warn \
            --model sim-model --policy-prefill "${policy%%/*}" --policy-decode "$row_decode" \
            "${row_args[@]}" --prefill "${pre[@]}" --decode "${dec[@]}")
          urls+=(--url "http://127.0.0.1:$port") gports+=("$port")
        done
        # through-one: all N replicas run, the trace goes to the first only.
        [[ $row_traffic == alternating ]] || urls=("${urls[@]:0:2}")
        replay=$(python3 "$ROOT/bench/trace_replay.py" --trace "$trace" "${urls[@]}" --speed "$speed" \
          --limit "$limit" --max-tokens "$max_tokens")
        gmetrics=null
        if ((${#gateway_metrics[@]})); then gmetrics=$(gateway_metrics_json "${gports[@]}"); fi
        per_engine=$(engines_json "${pports[@]}")
        stop_all
        python3 - "$n" "$row_traffic" "$policy" "$replay" "$ceil" "$gmetrics" "$per_engine" "$rep" \
          >> "$OUT/rows.jsonl" <<'PY'
import json, sys
n, traffic, policy, replay, ceil, gmetrics, per_engine, rep = sys.argv[1:]
engines = json.loads(per_engine)
hits, queries = sum(e["hits"] for e in engines), sum(e["queries"] for e in engines)
row = {"replicas": int(n), "traffic": traffic, "policy": policy, "repeat": int(rep), "hits": hits,
       "queries": queries,
       "hit_rate": round(hits / queries, 4) if queries else 0.0,
       "ceilings": json.loads(ceil)}
row.update(json.loads(replay))
if json.loads(gmetrics) is not None:
    row["gateway_metrics"] = json.loads(gmetrics)
row["prefill_engines"] = engines
print(json.dumps(row))
PY
        tail -1 "$OUT/rows.jsonl" >&2
      done
    done
  done
done

python3 - "$OUT/rows.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
if not rows:
    sys.exit(0)
c = rows[0]["ceilings"]
# With --repeat, a last column says which repeat a row is of.
repeats = any(r.get("repeat", 1) > 1 for r in rows)
print("| replicas | traffic | prefill policy | hit rate | TTFT p50 | p90 | p99 | failures |" +
      (" repeat |" if repeats else ""))
print("|---|---|---|---|---|---|---|---|" + ("---|" if repeats else ""))
for r in rows:
    t = r["ttft_ms"]
    ms = lambda v: "-" if v is None else "%.0f ms" % v
    print("| %d | %s | %s | %.3f | %s | %s | %s | %d / %d |" % (
        r["replicas"], r.get("traffic", "alternating"), r["policy"], r["hit_rate"], ms(t["p50"]), ms(t["p90"]), ms(t["p99"]),
        r["failures"], r["requests"]) + (" %d |" % r.get("repeat", 1) if repeats else ""))
print()
print("Ceilings from the trace: one infinite cache %.3f; one LRU cache of the engines' "
      "total capacity %.3f." % (c["infinite"], c["lru"]))
PY
echo
python3 "$ROOT/bench/routing_ratios.py" "$OUT/rows.jsonl"
