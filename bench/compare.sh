#!/usr/bin/env bash
# One command: pdgate next to the floor (the client talking to pdgate-sim
# directly) and next to nginx as a plain one-hop reverse proxy. Two floors:
# "direct" (one request to a --role both engine) for one-hop and nginx, and
# "direct P/D" (the client itself POSTs to the prefill engine, then to the
# decode engine with the returned kv_transfer_params) for pdgate P/D.
#
#   bench/compare.sh [BUILD_DIR]        (default: build)
#
# Environment: ROUNDS (3), SECONDS_PER_RUN (4), STATIC_ROUNDS (8) and
# STATIC_SECONDS (2) for the CPU-per-request rows against static engines,
# STREAMS (10000), OUT (bench/results). Writes $OUT/results.md, $OUT/raw.jsonl and PNG plots.
# Everything runs on loopback; every process started here is stopped on exit.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
out=${OUT:-$root/bench/results}
rounds=${ROUNDS:-3}
secs=${SECONDS_PER_RUN:-4}
static_rounds=${STATIC_ROUNDS:-8}
static_secs=${STATIC_SECONDS:-2}
streams=${STREAMS:-10000}

sim=$build/pdgate-sim
gw=$build/pdgate
lg=$build/pdgate-loadgen
for b in "$sim" "$gw" "$lg"; do
  [[ -x $b ]] || { echo "missing $b: build first (see bench/README.md)" >&2; exit 1; }
done

# nginx (the reference proxy) and gnuplot (the plots) come from Debian.
if ! command -v nginx >/dev/null && [[ ! -x /usr/sbin/nginx ]]; then
  echo "installing nginx..." >&2
  apt-get install -y --no-install-recommends nginx-light >/dev/null 2>&1 ||
    { apt-get update >/dev/null && apt-get install -y --no-install-recommends nginx-light >/dev/null; }
fi
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
if ! command -v strace >/dev/null; then
  echo "installing strace..." >&2
  apt-get install -y --no-install-recommends strace >/dev/null 2>&1 ||
    { apt-get update >/dev/null && apt-get install -y --no-install-recommends strace >/dev/null; } ||
    echo "strace unavailable: no system-call counts" >&2
fi
if ! command -v gnuplot >/dev/null; then
  echo "installing gnuplot..." >&2
  apt-get install -y --no-install-recommends gnuplot-nox >/dev/null 2>&1 ||
    { apt-get update >/dev/null && apt-get install -y --no-install-recommends gnuplot-nox >/dev/null; } ||
    echo "gnuplot unavailable: no plots" >&2
fi

# 10,000 held streams need 20,000 descriptors in the gateway (client and
# engine side of each). Where the hard limit is lower (containers), hold
# as many as fit and report the RSS per stream extrapolated to $STREAMS.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
nofile=$(ulimit -n)
target_streams=$streams
if ((streams * 2 + 64 > nofile)); then
  streams=$(((nofile - 64) / 2))
  echo "open-file limit $nofile: holding $streams streams, not $target_streams" >&2
fi

tmp=$(mktemp -d /tmp/pdgate-bench.XXXXXX)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

# start NAME CMD...: runs CMD in the background and waits for its
# "listening on http://HOST:PORT" line; sets $port.
start() {
  local name=$1
  shift
  "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
  pids+=($!)
  local i
  for i in $(seq 1 200); do
    port=$(sed -n 's/.*listening on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$tmp/$name.out" | head -1)
    [[ -n $port ]] && return 0
    sleep 0.05
  done
  echo "$name did not start:" >&2
  cat "$tmp/$name.err" >&2
  exit 1
}

pid_of_last() { echo "${pids[${#pids[@]}-1]}"; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }


# Engines. "fast" ones answer at once (no prefill or per-token time), so
# what is measured is the HTTP path; "stream" ones pace tokens like a real
# decode (5 ms apart) so clumping would show. Big limits keep the sims
# from queueing or rejecting anything the workloads send.
common=(--host 127.0.0.1 --port 0 --log-level error --max-num-seqs 100000 --max-waiting 100000
  --max-model-len 10000000 --kv-blocks 10000000 --prefill-lanes 0 --kv-pull-ms 0 --seed 1)
fast=(--itl-ms 0 --prefill-us-per-token 0 --prefill-base-ms 0)
paced=(--itl-ms 5 --prefill-us-per-token 0 --prefill-base-ms 1)
start sim_fast "$sim" --role both "${common[@]}" "${fast[@]}"; p_fast=$port; s_fast_pid=$(pid_of_last)
start sim_fast_p "$sim" --role prefill "${common[@]}" "${fast[@]}"; p_fast_p=$port; s_fast_p_pid=$(pid_of_last)
start sim_fast_d "$sim" --role decode "${common[@]}" "${fast[@]}"; p_fast_d=$port; s_fast_d_pid=$(pid_of_last)
start sim_str "$sim" --role both "${common[@]}" "${paced[@]}"; p_str=$port; s_str_pid=$(pid_of_last)
start sim_str_p "$sim" --role prefill "${common[@]}" "${paced[@]}"; p_str_p=$port; s_str_p_pid=$(pid_of_last)
start sim_str_d "$sim" --role decode "${common[@]}" "${paced[@]}"; p_str_d=$port; s_str_d_pid=$(pid_of_last)
# Held streams: the first token is an hour away.
start sim_hold "$sim" --role both "${common[@]}" --itl-ms 3600000 --prefill-base-ms 0 \
  --prefill-us-per-token 0
p_hold=$port

# Gateways: one worker thread each, as nginx gets one worker process.
gwopts=(--host 127.0.0.1 --port 0 --workers 1 --log-level error)
start gw_fast_1 "$gw" "${gwopts[@]}" --prefill-servers-urls disable \
  --decode-servers-urls "http://127.0.0.1:$p_fast"
g_fast_1=$port
g_fast_1_pid=$(pid_of_last)
start gw_fast_pd "$gw" "${gwopts[@]}" --prefill "127.0.0.1:$p_fast_p" --decode "127.0.0.1:$p_fast_d"
g_fast_pd=$port
g_fast_pd_pid=$(pid_of_last)
start gw_str_1 "$gw" "${gwopts[@]}" --prefill-servers-urls disable \
  --decode-servers-urls "http://127.0.0.1:$p_str"
g_str_1=$port
g_str_1_pid=$(pid_of_last)
start gw_str_pd "$gw" "${gwopts[@]}" --prefill "127.0.0.1:$p_str_p" --decode "127.0.0.1:$p_str_d"
g_str_pd=$port
g_str_pd_pid=$(pid_of_last)
start gw_hold "$gw" "${gwopts[@]}" --prefill-servers-urls disable \
  --decode-servers-urls "http://127.0.0.1:$p_hold" --client-idle-timeout 600s \
  --upstream-idle-timeout 3600s
g_hold=$port
gw_hold_pid=$(pid_of_last)

# nginx: a plain reverse proxy, one hop, no response buffering, HTTP/1.1
# keep-alive to the engines; config, pid and logs in the temp dir.
n_fast=$(free_port)
n_str=$(free_port)
n_hold=$(free_port)
mkdir -p "$tmp/nginx"
user_line=""
[[ $EUID -eq 0 ]] && user_line="user root;"
cat >"$tmp/nginx/nginx.conf" <<EOF
$user_line
daemon off;
worker_processes 1;
worker_rlimit_nofile 65536;
pid $tmp/nginx/nginx.pid;
error_log $tmp/nginx/error.log warn;
events { worker_connections 30000; }
http {
  access_log off;
  client_body_temp_path $tmp/nginx/body;
  proxy_temp_path $tmp/nginx/proxy;
  fastcgi_temp_path $tmp/nginx/fastcgi;
  uwsgi_temp_path $tmp/nginx/uwsgi;
  scgi_temp_path $tmp/nginx/scgi;
  client_max_body_size 64m;
  client_body_buffer_size 2m;
  keepalive_requests 1000000;
  proxy_read_timeout 3600s;
  upstream fast { server 127.0.0.1:$p_fast; keepalive 512; keepalive_requests 1000000; }
  upstream paced { server 127.0.0.1:$p_str; keepalive 512; keepalive_requests 1000000; }
  upstream hold { server 127.0.0.1:$p_hold; keepalive 512; }
  proxy_http_version 1.1;
  proxy_set_header Connection "";
  proxy_buffering off;
  server { listen 127.0.0.1:$n_fast; location / { proxy_pass http://fast; } }
  server { listen 127.0.0.1:$n_str; location / { proxy_pass http://paced; } }
  server { listen 127.0.0.1:$n_hold; location / { proxy_pass http://hold; } }
}
EOF
"$nginx_bin" -c "$tmp/nginx/nginx.conf" -e "$tmp/nginx/error.log" 2>"$tmp/nginx/stderr" &
pids+=($!)
for _ in $(seq 1 100); do
  [[ -s $tmp/nginx/nginx.pid ]] && break
  sleep 0.05
done
[[ -s $tmp/nginx/nginx.pid ]] || { echo "nginx did not start:" >&2; cat "$tmp/nginx/stderr" >&2; exit 1; }
sleep 0.2
nginx_worker=$(pgrep -P "$(cat "$tmp/nginx/nginx.pid")" | head -1)

# Static-answer engines: an nginx answering every request with a fixed body
# at once, so the engine costs next to nothing and what is measured is the
# proxy: a 4-event chat stream, a whole chat answer, a prefill answer with
# kv_transfer_params. In front of them, each its own process: nginx as a
# one-hop proxy, pdgate one hop, pdgate P/D.
s_stream=$(free_port)
s_whole=$(free_port)
s_prefill=$(free_port)
n_sstream=$(free_port)
n_swhole=$(free_port)
ev() {
  printf 'data: {"id":"chatcmpl-s","object":"chat.completion.chunk","created":1,"model":"sim-model","choices":[{"index":0,"delta":%s,"finish_reason":%s}]}\\n\\n' "$1" "$2"
}
sse_body="$(ev '{"role":"assistant","content":""}' null)$(ev '{"content":" the"}' null)$(ev '{}' '"stop"')data: [DONE]\n\n"
whole_body='{"id":"chatcmpl-s","object":"chat.completion","created":1,"model":"sim-model","choices":[{"index":0,"message":{"role":"assistant","content":" the quick brown fox"},"finish_reason":"length"}],"usage":{"prompt_tokens":8,"total_tokens":12,"completion_tokens":4}}'
prefill_body='{"id":"cmpl-s","object":"chat.completion","created":1,"model":"sim-model","choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"length"}],"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1,2,3],"remote_engine_id":"static","remote_host":"127.0.0.1","remote_port":1,"tp_size":1}}'
mkdir -p "$tmp/static"
# nginx_conf NAME SERVERS: a one-worker nginx configuration in $tmp/static.
nginx_conf() {
  cat >"$tmp/static/$1.conf" <<EOF
$user_line
daemon off;
worker_processes 1;
worker_rlimit_nofile 65536;
pid $tmp/static/$1.pid;
error_log $tmp/static/$1.log warn;
events { worker_connections 30000; }
http {
  access_log off;
  client_body_temp_path $tmp/static/$1-body;
  proxy_temp_path $tmp/static/$1-proxy;
  fastcgi_temp_path $tmp/static/$1-fastcgi;
  uwsgi_temp_path $tmp/static/$1-uwsgi;
  scgi_temp_path $tmp/static/$1-scgi;
  keepalive_requests 1000000;
  client_body_buffer_size 1m;
  $2
}
EOF
  "$nginx_bin" -c "$tmp/static/$1.conf" -e "$tmp/static/$1.log" 2>"$tmp/static/$1.stderr" &
  pids+=($!)
  for _ in $(seq 1 100); do
    [[ -s $tmp/static/$1.pid ]] && break
    sleep 0.05
  done
  [[ -s $tmp/static/$1.pid ]] || { echo "nginx $1 did not start:" >&2; cat "$tmp/static/$1.stderr" >&2; exit 1; }
  sleep 0.2
}
nginx_conf engines "
  server { listen 127.0.0.1:$s_stream; location / { default_type text/event-stream; return 200 '$sse_body'; } }
  server { listen 127.0.0.1:$s_whole; location / { default_type application/json; return 200 '$whole_body'; } }
  server { listen 127.0.0.1:$s_prefill; location / { default_type application/json; return 200 '$prefill_body'; } }"
nginx_conf proxy "
  upstream sstream { server 127.0.0.1:$s_stream; keepalive 512; keepalive_requests 1000000; }
  upstream swhole { server 127.0.0.1:$s_whole; keepalive 512; keepalive_requests 1000000; }
  proxy_http_version 1.1;
  proxy_set_header Connection \"\";
  proxy_buffering off;
  server { listen 127.0.0.1:$n_sstream; location / { proxy_pass http://sstream; } }
  server { listen 127.0.0.1:$n_swhole; location / { proxy_pass http://swhole; } }"
static_proxy_worker=$(pgrep -P "$(cat "$tmp/static/proxy.pid")" | head -1)
sgw=(--host 127.0.0.1 --port 0 --workers 1 --log-level error --health-interval off
  --metrics-interval off)
start gw_sstream "$gw" "${sgw[@]}" --prefill-servers-urls disable \
  --decode-servers-urls "http://127.0.0.1:$s_stream"
g_sstream=$port
g_sstream_pid=$(pid_of_last)
start gw_swhole "$gw" "${sgw[@]}" --prefill-servers-urls disable \
  --decode-servers-urls "http://127.0.0.1:$s_whole"
g_swhole=$port
g_swhole_pid=$(pid_of_last)
start gw_spd_stream "$gw" "${sgw[@]}" --prefill "127.0.0.1:$s_prefill" --decode "127.0.0.1:$s_stream"
g_spd_stream=$port
g_spd_stream_pid=$(pid_of_last)
start gw_spd_whole "$gw" "${sgw[@]}" --prefill "127.0.0.1:$s_prefill" --decode "127.0.0.1:$s_whole"
g_spd_whole=$port
g_spd_whole_pid=$(pid_of_last)

mkdir -p "$out"
raw=$out/raw.jsonl
: >"$raw"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

# CPU time (ns) processes have used, all threads (PIDS: comma-separated):
# the proxies' CPU per request is what machine noise changes least.
cpu_ns() {
  local f a p s=0
  for p in ${1//,/ }; do
    for f in /proc/"$p"/task/*/schedstat; do
      read -r a _ <"$f" && s=$((s + a))
    done
  done
  echo "$s"
}

# run WORKLOAD TARGET PORT PIDS loadgen-args...: one measurement, one JSON
# line; PIDS are the processes whose CPU time is charged to the target.
run() {
  local workload=$1 target=$2 p=$3 pid=$4
  shift 4
  local line c0 c1
  c0=$(cpu_ns "$pid")
  line=$("$lg" --url "http://127.0.0.1:$p" --json --label "$workload/$target" "$@" 2>/dev/null) ||
    line="{\"label\":\"$workload/$target\",\"ok\":0,\"errors\":1}"
  c1=$(cpu_ns "$pid")
  echo "{\"round\":$round,\"workload\":\"$workload\",\"target\":\"$target\",\"cpu_ns\":$((c1 - c0)),\"result\":$line}" >>"$raw"
}

# Each round measures every target once per workload, in a rotated order,
# so that machine noise (other builds on these 2 cores) hits all alike.
rotate() {
  local n=$1
  shift
  local a=("$@")
  local i
  for i in "${!a[@]}"; do echo "${a[$(((i + n) % ${#a[@]}))]}"; done
}
for round in $(seq 1 "$rounds"); do
  echo "round $round/$rounds ($(cut -d' ' -f1 /proc/loadavg) load)" >&2
  mapfile -t order < <(rotate "$round" direct directpd nginx onehop pd)
  for t in "${order[@]}"; do
    # xf / xs: the target's own loadgen flags for the fast / paced engines.
    xf=() xs=()
    case $t in
      direct) pf=$p_fast ps=$p_str cf=$s_fast_pid cs=$s_str_pid ;;
      # The P/D floor: the client does the handshake with the P/D engines
      # that pdgate P/D fronts; both engines' CPU is charged to it.
      directpd)
        pf=$p_fast_d ps=$p_str_d cf=$s_fast_p_pid,$s_fast_d_pid cs=$s_str_p_pid,$s_str_d_pid
        xf=(--prefill-url "http://127.0.0.1:$p_fast_p") xs=(--prefill-url "http://127.0.0.1:$p_str_p")
        ;;
      nginx) pf=$n_fast ps=$n_str cf=$nginx_worker cs=$nginx_worker ;;
      onehop) pf=$g_fast_1 ps=$g_str_1 cf=$g_fast_1_pid cs=$g_str_1_pid ;;
      pd) pf=$g_fast_pd ps=$g_str_pd cf=$g_fast_pd_pid cs=$g_str_pd_pid ;;
    esac
    # Throughput: many requests in flight, short answers.
    run throughput "$t" "$pf" "$cf" "${xf[@]}" --concurrency 32 --max-tokens 16 --duration "$secs" --warmup 0.5
    # Added latency: one request at a time.
    run latency "$t" "$pf" "$cf" "${xf[@]}" --concurrency 1 --max-tokens 16 --duration "$secs" --warmup 0.3
    # Streaming: paced tokens, time to first token and inter-token gaps.
    run stream "$t" "$ps" "$cs" "${xs[@]}" --stream --chat --concurrency 8 --max-tokens 32 --duration "$secs" \
      --warmup 0.5
    # Prompt size: 1 KiB against 1 MiB, one at a time.
    run prompt_1k "$t" "$pf" "$cf" "${xf[@]}" --concurrency 1 --max-tokens 1 --prompt-bytes 1024 \
      --duration "$((secs / 2 + 1))" --warmup 0.3
    run prompt_1m "$t" "$pf" "$cf" "${xf[@]}" --concurrency 1 --max-tokens 1 --prompt-bytes 1048576 \
      --duration "$((secs / 2 + 1))" --warmup 0.3
  done
done

# Against the static engines: the proxies' own CPU per request. Rounds of
# their own, more and shorter than the rounds above: each ratio pairs runs
# a few seconds apart, so a burst of load from elsewhere on the machine
# lands in few rounds, and the median over rounds leaves it out.
for round in $(seq 1 "$static_rounds"); do
  echo "static round $round/$static_rounds ($(cut -d' ' -f1 /proc/loadavg) load)" >&2
  mapfile -t order < <(rotate "$round" nginx onehop pd)
  for t in "${order[@]}"; do
    case $t in
      nginx) ps=$n_sstream pw=$n_swhole cs=$static_proxy_worker cw=$static_proxy_worker ;;
      onehop) ps=$g_sstream pw=$g_swhole cs=$g_sstream_pid cw=$g_swhole_pid ;;
      pd) ps=$g_spd_stream pw=$g_spd_whole cs=$g_spd_stream_pid cw=$g_spd_whole_pid ;;
    esac
    run static_stream "$t" "$ps" "$cs" --chat --stream --concurrency 32 --duration "$static_secs" \
      --warmup 0.5
    run static_whole "$t" "$pw" "$cw" --chat --concurrency 32 --duration "$static_secs" --warmup 0.5
  done
done

# System calls per request, counted by strace over a fixed number of
# requests (strace slows the process down; only the counts are kept).
syscalls() {
  local workload=$1 target=$2 p=$3 pid=$4
  shift 4
  command -v strace >/dev/null || return 0
  local n=4000 f=$tmp/strace-$workload-$target
  strace -c -f -q -o "$f" -p "$pid" &
  local spid=$!
  sleep 0.5
  "$lg" --url "http://127.0.0.1:$p" --json --requests "$n" --duration 120 --warmup 0 "$@" >/dev/null 2>&1 || true
  sleep 0.2
  kill -INT "$spid" 2>/dev/null || true
  wait "$spid" 2>/dev/null || true
  # strace -c's last line: "100.00 SECONDS USECS CALLS [ERRORS] total".
  local calls
  calls=$(awk '$NF == "total" {print ($(NF-2) ~ /^[0-9]+$/ && NF == 6) ? $(NF-2) : $(NF-1)}' "$f" 2>/dev/null)
  echo "{\"workload\":\"syscalls_$workload\",\"target\":\"$target\",\"requests\":$n,\"calls\":${calls:-0}}" >>"$raw"
}
syscalls stream nginx "$n_sstream" "$static_proxy_worker" --chat --stream --concurrency 32
syscalls stream onehop "$g_sstream" "$g_sstream_pid" --chat --stream --concurrency 32
syscalls stream pd "$g_spd_stream" "$g_spd_stream_pid" --chat --stream --concurrency 32
syscalls whole nginx "$n_swhole" "$static_proxy_worker" --chat --concurrency 32
syscalls whole onehop "$g_swhole" "$g_swhole_pid" --chat --concurrency 32
syscalls whole pd "$g_spd_whole" "$g_spd_whole_pid" --chat --concurrency 32

# Idle streams: $streams streams held through pdgate (then nginx, for
# scale); gateway RSS before and while they are held.
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
hold() {
  local target=$1 p=$2 pid=$3
  local before early during held
  before=$(rss_kib "$pid")
  : >"$tmp/hold-$target.out"
  "$lg" --url "http://127.0.0.1:$p" --concurrency "$streams" --hold 8 >"$tmp/hold-$target.out" 2>&1 &
  local lpid=$!
  pids+=("$lpid")
  for _ in $(seq 1 1200); do
    grep -q HOLDING "$tmp/hold-$target.out" && break
    sleep 0.05
  done
  # RSS 1 s after the last stream opened, and 4 s after: by then the
  # memory the burst of openings freed has been handed back (pdgate's
  # workers do so once a second of quiet has passed), and what is left is
  # what the held streams cost.
  sleep 1
  early=$(rss_kib "$pid")
  sleep 3
  during=$(rss_kib "$pid")
  held=$(sed -n 's/HOLDING \([0-9]*\) streams.*/\1/p' "$tmp/hold-$target.out")
  wait "$lpid" || true
  echo "{\"workload\":\"hold\",\"target\":\"$target\",\"streams\":${held:-0},\"rss_before_kib\":$before,\"rss_early_kib\":$early,\"rss_during_kib\":$during}" >>"$raw"
}
hold pdgate "$g_hold" "$gw_hold_pid"
[[ -n $nginx_worker ]] && hold nginx "$n_hold" "$nginx_worker"

load_after=$(cut -d' ' -f1-3 /proc/loadavg)
python3 "$here/report.py" "$raw" "$out" "$load_before" "$load_after" "$rounds" "$secs" "$target_streams" \
  "$static_rounds" "$static_secs"
if command -v gnuplot >/dev/null; then
  for g in "$out"/*.gp; do gnuplot "$g"; done
  rm -f "$out"/*.gp
fi
echo "wrote $out/results.md" >&2
