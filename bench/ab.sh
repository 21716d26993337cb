#!/usr/bin/env bash
# Two or more pdgate binaries against each other and against nginx, one
# hop in front of a static-answer engine (compare.sh's, an nginx that
# answers every request at once), for before/after measurements of a
# change on a noisy machine: each round runs nginx and every binary in
# turn, and the ratios are taken within a round.
#
#   bench/ab.sh BINARY [BINARY...]
#
# Each BINARY is a pdgate executable (copy the "before" build's aside
# first). Environment: ROUNDS (8), SECONDS_PER_RUN (2), CONCURRENCY (32),
# LOADGEN (build/pdgate-loadgen). Prints, per answer kind (4-event stream,
# whole answer): nginx ÷ binary CPU per request (the compare.sh target),
# and each binary's CPU per request ÷ the first binary's, as medians and
# ranges over the rounds. Everything runs on loopback; every process
# started here is stopped on exit.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
(($# >= 1)) || { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
rounds=${ROUNDS:-8}
secs=${SECONDS_PER_RUN:-2}
conc=${CONCURRENCY:-32}
lg=${LOADGEN:-$root/build/pdgate-loadgen}
[[ -x $lg ]] || { echo "missing $lg: build first" >&2; exit 1; }
for b in "$@"; do [[ -x $b ]] || { echo "not an executable: $b" >&2; exit 1; }; done
if ! command -v nginx >/dev/null && [[ ! -x /usr/sbin/nginx ]]; then
  apt-get install -y --no-install-recommends nginx-light >/dev/null 2>&1 ||
    { apt-get update >/dev/null && apt-get install -y --no-install-recommends nginx-light >/dev/null; }
fi
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)

tmp=$(mktemp -d /tmp/pdgate-ab.XXXXXX)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# The engines' answers: compare.sh's 4-event chat stream and whole answer.
ev() {
  printf 'data: {"id":"chatcmpl-s","object":"chat.completion.chunk","created":1,"model":"sim-model","choices":[{"index":0,"delta":%s,"finish_reason":%s}]}\\n\\n' "$1" "$2"
}
sse_body="$(ev '{"role":"assistant","content":""}' null)$(ev '{"content":" the"}' null)$(ev '{}' '"stop"')data: [DONE]\n\n"
whole_body='{"id":"chatcmpl-s","object":"chat.completion","created":1,"model":"sim-model","choices":[{"index":0,"message":{"role":"assistant","content":" the quick brown fox"},"finish_reason":"length"}],"usage":{"prompt_tokens":8,"total_tokens":12,"completion_tokens":4}}'
e_stream=$(free_port)
e_whole=$(free_port)
n_stream=$(free_port)
n_whole=$(free_port)
user_line=""
[[ $EUID -eq 0 ]] && user_line="user root;"
# nginx_start NAME HTTP_BLOCK: a one-worker nginx; sets $nginx_worker.
nginx_start() {
  cat >"$tmp/$1.conf" <<EOF
$user_line
daemon off;
worker_processes 1;
worker_rlimit_nofile 65536;
pid $tmp/$1.pid;
error_log $tmp/$1.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $tmp/$1-body;
  proxy_temp_path $tmp/$1-proxy;
  fastcgi_temp_path $tmp/$1-fastcgi;
  uwsgi_temp_path $tmp/$1-uwsgi;
  scgi_temp_path $tmp/$1-scgi;
  keepalive_requests 1000000;
  $2
}
EOF
  "$nginx_bin" -c "$tmp/$1.conf" -e "$tmp/$1.log" 2>"$tmp/$1.stderr" &
  pids+=($!)
  for _ in $(seq 100); do
    [[ -s $tmp/$1.pid ]] && break
    sleep 0.05
  done
  [[ -s $tmp/$1.pid ]] || { echo "nginx $1 did not start:" >&2; cat "$tmp/$1.stderr" >&2; exit 1; }
  sleep 0.2
  nginx_worker=$(pgrep -P "$(cat "$tmp/$1.pid")" | head -1)
}
nginx_start engines "
  server { listen 127.0.0.1:$e_stream; location / { default_type text/event-stream; return 200 '$sse_body'; } }
  server { listen 127.0.0.1:$e_whole; location / { default_type application/json; return 200 '$whole_body'; } }"
nginx_start proxy "
  upstream s { server 127.0.0.1:$e_stream; keepalive 512; keepalive_requests 1000000; }
  upstream w { server 127.0.0.1:$e_whole; keepalive 512; keepalive_requests 1000000; }
  proxy_http_version 1.1;
  proxy_set_header Connection \"\";
  proxy_buffering off;
  server { listen 127.0.0.1:$n_stream; location / { proxy_pass http://s; } }
  server { listen 127.0.0.1:$n_whole; location / { proxy_pass http://w; } }"

# Targets: "name kind port pid", nginx first.
targets=("nginx stream $n_stream $nginx_worker" "nginx whole $n_whole $nginx_worker")
i=0
for b in "$@"; do
  for kind in stream whole; do
    engine=$([[ $kind == stream ]] && echo "$e_stream" || echo "$e_whole")
    out=$tmp/gw$i-$kind.out
    "$b" --host 127.0.0.1 --port 0 --workers 1 --log-level error --health-interval off \
      --metrics-interval off --prefill-servers-urls disable \
      --decode-servers-urls "http://127.0.0.1:$engine" >"$out" 2>&1 &
    pids+=($!)
    pid=$!
    port=""
    for _ in $(seq 200); do
      port=$(sed -n 's/.*listening on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$out" | head -1)
      [[ -n $port ]] && break
      sleep 0.05
    done
    [[ -n $port ]] || { echo "$b did not start:" >&2; cat "$out" >&2; exit 1; }
    targets+=("b$i $kind $port $pid")
  done
  i=$((i + 1))
done

# CPU time (ns) a process has used, all its threads.
cpu_ns() {
  local f a s=0
  for f in /proc/"$1"/task/*/schedstat; do
    read -r a _ <"$f" && s=$((s + a))
  done
  echo "$s"
}
results=$tmp/results
: >"$results"
for round in $(seq 1 "$rounds"); do
  echo "round $round/$rounds ($(cut -d' ' -f1 /proc/loadavg) load)" >&2
  for t in "${targets[@]}"; do
    read -r name kind port pid <<<"$t"
    flags=(--chat)
    [[ $kind == stream ]] && flags+=(--stream)
    c0=$(cpu_ns "$pid")
    line=$("$lg" --url "http://127.0.0.1:$port" --json "${flags[@]}" --concurrency "$conc" \
      --duration "$secs" --warmup 0.3 2>/dev/null) || line='{"all":0}'
    c1=$(cpu_ns "$pid")
    echo "$round $name $kind $((c1 - c0)) $line" >>"$results"
  done
done

python3 - "$results" "$@" <<'EOF'
import json, statistics, sys
path, binaries = sys.argv[1], sys.argv[2:]
cpu = {}  # (round, name, kind) -> µs per request
for line in open(path):
    rnd, name, kind, ns, js = line.split(" ", 4)
    n = json.loads(js).get("all", 0)
    if n:
        cpu[(rnd, name, kind)] = int(ns) / 1000 / n
rounds = sorted({k[0] for k in cpu})

def summary(values):
    return "%.3f (%.3f-%.3f)" % (statistics.median(values), min(values), max(values))

for kind in ("stream", "whole"):
    print(f"{kind}: nginx CPU/request median %.1f µs" %
          statistics.median([cpu[(r, "nginx", kind)] for r in rounds if (r, "nginx", kind) in cpu]))
    for i, b in enumerate(binaries):
        name = f"b{i}"
        mine = [cpu[(r, name, kind)] for r in rounds if (r, name, kind) in cpu]
        ratio = [cpu[(r, "nginx", kind)] / cpu[(r, name, kind)] for r in rounds
                 if (r, name, kind) in cpu and (r, "nginx", kind) in cpu]
        line = f"  {b}: CPU/request median %.1f µs, nginx ÷ it %s" % (statistics.median(mine),
                                                                      summary(ratio))
        if i > 0:
            rel = [cpu[(r, name, kind)] / cpu[(r, "b0", kind)] for r in rounds
                   if (r, name, kind) in cpu and (r, "b0", kind) in cpu]
            line += f", ÷ {binaries[0]} {summary(rel)}"
        print(line)
EOF
