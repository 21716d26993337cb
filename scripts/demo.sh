#!/usr/bin/env bash
# The pdgate demo, end to end on one machine without GPUs: installs the
# dependencies, builds, starts 2 prefill + 2 decode simulated vLLM engines
# (pdgate-sim) on ephemeral ports and pdgate in front of them, then sends a
# streamed chat request (watch the tokens arrive), a non-streamed one, and
# prints /status. Everything it started is stopped when it exits.
#
# Usage: bash scripts/demo.sh [--keep] [--no-deps] [--no-build]
#   --keep      leave the gateway and engines running (until Ctrl-C) and
#               print curl commands to try
#   --no-deps   skip scripts/install-deps.sh
#   --no-build  use the binaries already in the build tree
# Environment: PORT (gateway port; default 8000, or a free one if 8000 is
# taken), HOST (gateway listen address, 127.0.0.1), BUILD_DIR (build/),
# ITL_MS (engine time per output token, 60), MAX_TOKENS (40).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
HOST="${HOST:-127.0.0.1}"
ITL_MS="${ITL_MS:-60}"
MAX_TOKENS="${MAX_TOKENS:-40}"
MODEL=sim-model
keep=0
deps=1
build=1

usage() { sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

while (($#)); do
  case "$1" in
    --keep) keep=1 ;;
    --no-deps) deps=0 ;;
    --no-build) build=0 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "demo.sh: unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

# Colours only on a terminal.
if [[ -t 1 ]]; then
  bold=$'\e[1m' dim=$'\e[2m' reset=$'\e[0m'
else
  bold='' dim='' reset=''
fi
say() { printf '\n%s==> %s%s\n' "$bold" "$*" "$reset"; }
die() { printf 'demo.sh: %s\n' "$*" >&2; exit 1; }

# --- Processes: started in the background, each with its own stdout and
# stderr file; all of them are stopped on exit, Ctrl-C or TERM.
RUN_DIR="$(mktemp -d "${TMPDIR:-/tmp}/pdgate-demo.XXXXXX")"
pids=()
names=()

cleanup() {
  local status=$?
  trap - EXIT INT TERM
  if ((${#pids[@]})); then
    printf '\n%sdemo.sh: stopping %d process(es)%s\n' "$dim" "${#pids[@]}" "$reset" >&2
    kill -TERM "${pids[@]}" 2>/dev/null || true
    # Give them a moment to exit cleanly, then insist.
    for _ in $(seq 1 30); do
      local alive=0
      for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
      ((alive)) || break
      sleep 0.1
    done
    kill -KILL "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
  fi
  if ((status != 0 && status != 130 && status != 143)); then
    printf 'demo.sh: failed; process logs are in %s\n' "$RUN_DIR" >&2
  else
    rm -rf "$RUN_DIR"
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# start NAME BINARY ARGS...: starts a process and waits for its
# "listening on http://HOST:PORT" line; sets LISTEN_PORT.
LISTEN_PORT=""
start() {
  local name="$1"
  shift
  local out="$RUN_DIR/$name.out" err="$RUN_DIR/$name.log"
  "$@" >"$out" 2>"$err" </dev/null &
  local pid=$!
  pids+=("$pid")
  names+=("$name")
  local line=""
  for _ in $(seq 1 300); do
    line="$(grep -m1 'listening on http://' "$out" 2>/dev/null || true)"
    [[ -n "$line" ]] && break
    if ! kill -0 "$pid" 2>/dev/null; then
      cat "$err" >&2
      die "$name exited before listening: $*"
    fi
    sleep 0.1
  done
  [[ -n "$line" ]] || { cat "$err" >&2; die "$name did not start within 30 s: $*"; }
  LISTEN_PORT="$(sed -n 's|.*listening on http://.*:\([0-9][0-9]*\).*|\1|p' <<<"$line")"
  [[ -n "$LISTEN_PORT" ]] || die "$name: cannot read the port from: $line"
  printf '  %-10s pid %-7s %s\n' "$name" "$pid" "${line#*listening on }"
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Pretty-prints JSON on stdin when node is there; passes it through if not.
pretty() {
  if command -v node >/dev/null 2>&1; then
    node -e '
      let s = "";
      process.stdin.on("data", (d) => (s += d)).on("end", () => {
        try { console.log(JSON.stringify(JSON.parse(s), null, 2)); } catch { console.log(s); }
      });'
  else
    cat
    echo
  fi
}

# --- Install and build.
if ((deps)); then
  say "Installing dependencies (scripts/install-deps.sh)"
  bash "$ROOT/scripts/install-deps.sh"
fi
if ((build)); then
  say "Building pdgate and pdgate-sim (scripts/build.sh)"
  bash "$ROOT/scripts/build.sh" --build-dir "$BUILD_DIR" --target pdgate --target pdgate-sim
fi
PDGATE="$BUILD_DIR/pdgate"
SIM="$BUILD_DIR/pdgate-sim"
[[ -x "$PDGATE" && -x "$SIM" ]] || die "missing $PDGATE or $SIM: build with scripts/build.sh"

# --- Engines: 2 prefill + 2 decode simulated vLLM instances.
say "Starting 2 prefill + 2 decode engines (pdgate-sim, ${ITL_MS} ms per token)"
sim_args=(--port 0 --model "$MODEL" --itl-ms "$ITL_MS")
prefill=()
decode=()
for i in 1 2; do
  start "prefill-$i" "$SIM" --role prefill "${sim_args[@]}"
  prefill+=("127.0.0.1:$LISTEN_PORT")
done
for i in 1 2; do
  start "decode-$i" "$SIM" --role decode "${sim_args[@]}"
  decode+=("127.0.0.1:$LISTEN_PORT")
done

# --- The gateway, with the command line of vLLM's disagg_proxy_demo.py.
if [[ -n "${PORT:-}" ]]; then
  port="$PORT"
elif port_in_use 8000; then
  port=0 # 8000 is taken: let pdgate pick a free port.
else
  port=8000
fi
cmd=("$PDGATE" --host "$HOST" --port "$port" --model "$MODEL"
  --prefill "${prefill[@]}" --decode "${decode[@]}")
say "Starting the gateway"
printf '  %s%s%s\n' "$dim" "${cmd[*]#"$BUILD_DIR/"}" "$reset"
start pdgate "${cmd[@]}"
BASE="http://127.0.0.1:$LISTEN_PORT"
[[ "$HOST" == 127.0.0.1 || "$HOST" == 0.0.0.0 || "$HOST" == localhost ]] ||
  BASE="http://$HOST:$LISTEN_PORT"

# Wait until it answers (it prints its line once listening; this is a
# cheap extra check that requests go through).
for _ in $(seq 1 50); do
  curl -fsS -o /dev/null "$BASE/health" 2>/dev/null && break
  sleep 0.1
done

# --- Requests.
chat_stream='{"model": "'"$MODEL"'", "max_tokens": '"$MAX_TOKENS"', "stream": true,
  "stream_options": {"include_usage": true},
  "messages": [{"role": "user", "content": "Tell me about disaggregated serving."}]}'
chat_plain='{"model": "'"$MODEL"'", "max_tokens": 16,
  "messages": [{"role": "user", "content": "Say hello in a few words."}]}'

say "Streamed chat: prefill on one engine, then the tokens stream from decode"
printf '%s$ curl -N %s/v1/chat/completions -H "Content-Type: application/json" -d ...%s\n\n' \
  "$dim" "$BASE" "$reset"
curl -N -sS -i --fail-with-body "$BASE/v1/chat/completions" \
  -H 'Content-Type: application/json' -d "$chat_stream"

say "Non-streamed chat"
curl -sS --fail-with-body "$BASE/v1/chat/completions" \
  -H 'Content-Type: application/json' -d "$chat_plain" | pretty

say "Gateway status (GET /status)"
curl -sS --fail-with-body "$BASE/status" | pretty

if ((!keep)); then
  say "Demo finished. Run with --keep to leave it running and try requests yourself."
  exit 0
fi

say "pdgate is running at $BASE (engines: prefill ${prefill[*]}, decode ${decode[*]})"
cat <<EOF

Try, in another terminal:

  # streamed chat (watch the tokens arrive)
  curl -N $BASE/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "$MODEL", "max_tokens": 40, "stream": true,
         "messages": [{"role": "user", "content": "Hello!"}]}'

  # plain completion
  curl $BASE/v1/completions -H 'Content-Type: application/json' \\
    -d '{"model": "$MODEL", "prompt": "The capital of France is", "max_tokens": 8}'

  # your own request id, returned in X-Request-Id and sent to both engines
  curl -i $BASE/v1/completions -H 'Content-Type: application/json' \\
    -H 'X-Request-Id: my-request-1' -d '{"model": "$MODEL", "prompt": "hi", "max_tokens": 4}'

  # models, health, status
  curl $BASE/v1/models
  curl $BASE/health
  curl $BASE/status

  # an error passed through from the engine (unknown model -> 404)
  curl -i $BASE/v1/completions -H 'Content-Type: application/json' \\
    -d '{"model": "nope", "prompt": "hi"}'

Logs: $RUN_DIR/*.log
Press Ctrl-C to stop everything.
EOF
# Sleep until interrupted, or until any process exits on its own.
while :; do
  for i in "${!pids[@]}"; do
    kill -0 "${pids[$i]}" 2>/dev/null || die "${names[$i]} exited; its log: $RUN_DIR/${names[$i]}.log"
  done
  sleep 1
done
