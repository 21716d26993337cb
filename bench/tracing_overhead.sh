#!/usr/bin/env bash
# What tracing costs the request path: pdgate one-hop (--workers 1) in
# front of a sim that answers at once, CPU per request (all of the
# gateway's threads, the exporter's included) with
#   base    a build without tracing (BASE_BUILD, optional: e.g. main's),
#   off     this build, no --otlp-endpoint (trace context and forwarded
#           headers still go to the engine),
#   on      this build exporting every span (sample ratio 1) to an OTLP
#           receiver that answers 200 (a small Python server here),
# in rounds whose order rotates so that machine noise hits all alike;
# ratios are taken within a round. Then, with callgrind (repeatable on a
# busy machine), user-space instructions per request for off and on.
#
# Usage: bench/tracing_overhead.sh [BUILD_DIR]   (ROUNDS, SECONDS_PER_RUN,
#        BASE_BUILD, CALLGRIND_REQUESTS in the environment)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(cd "${1:-$ROOT/build}" && pwd)
rounds=${ROUNDS:-3}
seconds=${SECONDS_PER_RUN:-4}
base_build=${BASE_BUILD:-}
cg_requests=${CALLGRIND_REQUESTS:-2000}
lg=$build/pdgate-loadgen
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# start NAME CMD...: runs CMD in the background; sets $port from its
# "listening on http://H:P" line.
start() {
  local name=$1
  shift
  "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
  pids+=($!)
  last_pid=$!
  for _ in $(seq 1 200); do
    port=$(grep -o 'listening on http://[^ ]*' "$tmp/$name.out" 2>/dev/null | head -1 | sed 's/.*://' || true)
    [[ -n $port ]] && return 0
    sleep 0.05
  done
  echo "tracing_overhead.sh: $name did not start" >&2
  cat "$tmp/$name.err" >&2
  exit 1
}

cpu_ns() {
  local f a s=0
  for f in /proc/"$1"/task/*/schedstat; do
    read -r a _ <"$f" && s=$((s + a))
  done
  echo "$s"
}

# The OTLP receiver: accepts POST /v1/traces, counts spans, answers 200.
cat >"$tmp/receiver.py" <<'PY'
import http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    spans = 0
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        for rs in json.loads(body)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                H.spans += len(ss["spans"])
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")
    def do_GET(self):
        b = str(H.spans).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(f"receiver listening on http://127.0.0.1:{s.server_port}", flush=True)
s.serve_forever()
PY
start receiver python3 "$tmp/receiver.py"
receiver=$port
start sim "$build/pdgate-sim" --port 0 --role both --model sim-model --itl-ms 0 \
  --prefill-us-per-token 0 --prefill-base-ms 0
sim=$port
gw=(--port 0 --workers 1 --prefill-servers-urls disable --decode-servers-urls
  "http://127.0.0.1:$sim" --log-level warn --health-interval off --metrics-interval off)
targets=()
if [[ -n $base_build ]]; then
  start base "$base_build/pdgate" "${gw[@]}"
  declare -A port_of=([base]=$port) pid_of=([base]=$last_pid)
  targets+=(base)
else
  declare -A port_of=() pid_of=()
fi
start off "$build/pdgate" "${gw[@]}"
port_of[off]=$port pid_of[off]=$last_pid
start on "$build/pdgate" "${gw[@]}" --otlp-endpoint "http://127.0.0.1:$receiver" \
  --otlp-export-interval 200ms --otlp-queue-size 1000000
port_of[on]=$port pid_of[on]=$last_pid
targets+=(off on)

raw=$tmp/raw.txt
: >"$raw"
body_flags=(--concurrency 8 --duration "$seconds" --max-tokens 4 --json)
for round in $(seq 1 "$rounds"); do
  n=${#targets[@]}
  for i in $(seq 0 $((n - 1))); do
    t=${targets[$(((i + round) % n))]}
    for workload in whole stream; do
      extra=()
      [[ $workload == stream ]] && extra=(--stream --chat)
      c0=$(cpu_ns "${pid_of[$t]}")
      line=$("$lg" --url "http://127.0.0.1:${port_of[$t]}" "${body_flags[@]}" "${extra[@]}")
      c1=$(cpu_ns "${pid_of[$t]}")
      ok=$(echo "$line" | python3 -c 'import json,sys; print(json.load(sys.stdin)["ok"])')
      echo "$round $workload $t $ok $((c1 - c0))" >>"$raw"
    done
  done
done
sleep 1
exported=$(curl -s --max-time 5 "http://127.0.0.1:$receiver/" || echo "?")
dropped=$(curl -s --max-time 5 "http://127.0.0.1:${port_of[on]}/metrics" |
  awk '/^pdgate_trace_spans_dropped_total/ {s += $2} END {print s + 0}')

python3 - "$raw" <<'PY'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1])]
per = {}  # (round, workload, target) -> us per request
for rnd, wl, t, ok, ns in rows:
    per[(rnd, wl, t)] = int(ns) / 1000 / max(1, int(ok))
rounds = sorted({r for r, _, _ in per})
targets = [t for t in ("base", "off", "on") if any(k[2] == t for k in per)]
print("| workload | " + " | ".join(f"{t} µs/req" for t in targets) +
      " | on ÷ off | off ÷ base |" if "base" in targets else
      "| workload | " + " | ".join(f"{t} µs/req" for t in targets) + " | on ÷ off |")
print("|" + " --- |" * (len(targets) + (3 if "base" in targets else 2)))
for wl in ("whole", "stream"):
    cells = []
    for t in targets:
        v = [per[(r, wl, t)] for r in rounds]
        cells.append(f"{statistics.median(v):.1f}")
    on_off = [per[(r, wl, "on")] / per[(r, wl, "off")] for r in rounds]
    row = f"| {wl} | " + " | ".join(cells) + \
          f" | {statistics.median(on_off):.3f}× ({min(on_off):.3f}–{max(on_off):.3f})"
    if "base" in targets:
        off_base = [per[(r, wl, "off")] / per[(r, wl, "base")] for r in rounds]
        row += f" | {statistics.median(off_base):.3f}× ({min(off_base):.3f}–{max(off_base):.3f})"
    print(row + " |")
PY
echo "spans exported to the receiver: $exported; dropped: $dropped"

# Callgrind: instructions per request, from two runs of different lengths
# (the difference cancels start-up and shutdown).
if command -v valgrind >/dev/null && ((cg_requests > 0)); then
  cg_targets=(off on)
  [[ -n $base_build ]] && cg_targets=(base off on)
  for t in "${cg_targets[@]}"; do
    bin=$build/pdgate
    [[ $t == base ]] && bin=$base_build/pdgate
    for n in $((cg_requests / 2)) "$cg_requests"; do
      flags=()
      [[ $t == on ]] && flags=(--otlp-endpoint "http://127.0.0.1:$receiver" --otlp-export-interval 200ms
        --otlp-queue-size 1000000)
      out=$tmp/cg-$t-$n
      valgrind --tool=callgrind --callgrind-out-file="$out.cg" "$bin" "${gw[@]}" \
        "${flags[@]}" >"$out.out" 2>"$out.err" &
      vpid=$!
      for _ in $(seq 1 600); do
        p=$(grep -o 'listening on http://[^ ]*' "$out.out" 2>/dev/null | head -1 | sed 's/.*://' || true)
        [[ -n $p ]] && break
        sleep 0.1
      done
      all=$("$lg" --url "http://127.0.0.1:$p" --concurrency 4 --requests "$n" --max-tokens 4 \
        --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["all"])')
      sleep 0.5
      kill -TERM "$vpid"
      wait "$vpid" || true
      ir=$(callgrind_annotate "$out.cg" | awk '/PROGRAM TOTALS/ && !seen {gsub(",", "", $1); print $1; seen = 1}')
      echo "$t $n $all $ir" >>"$tmp/cg.txt"
    done
  done
  python3 - "$tmp/cg.txt" <<'PY'
import sys
rows = {}
for l in open(sys.argv[1]):
    t, n, sent, ir = l.split()
    rows.setdefault(t, []).append((int(sent), int(ir)))
per = {}
for t, v in rows.items():
    (s1, i1), (s2, i2) = sorted(v)
    per[t] = (i2 - i1) / (s2 - s1)
line = "callgrind instructions per request (whole answer, c=4): " + ", ".join(
    f"{t} {per[t]:.0f}" for t in ("base", "off", "on") if t in per)
line += f"; on ÷ off {per['on'] / per['off']:.3f}×"
if "base" in per:
    line += f", off ÷ base {per['off'] / per['base']:.3f}×"
print(line)
PY
fi
