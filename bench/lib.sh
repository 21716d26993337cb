# Shared by the callgrind benchmarks (access_log_cost.sh, tls_cost.sh):
# source it after setting `build`. Gives the load's parameters (requests,
# concurrency, max_tokens, stream: from REQUESTS, CONCURRENCY, MAX_TOKENS,
# STREAM), `tmp` (a scratch directory) and `pids` (processes to stop), both
# cleaned up on exit, port_of and answered.

requests=${REQUESTS:-2000}
concurrency=${CONCURRENCY:-4}
max_tokens=${MAX_TOKENS:-4}
stream=${STREAM:-1}

for b in "$build/pdgate" "$build/pdgate-sim" "$build/pdgate-loadgen"; do
  [[ -x $b ]] || { echo "missing $b: build first" >&2; exit 1; }
done
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }

tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [[ -n ${KEEP:-} ]]; then cp "$tmp"/cg.* "$KEEP"/ 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# Prints the port a process announced ("listening on http[s]://H:P") in $1.
port_of() {
  local f=$1
  for _ in $(seq 600); do
    if grep -q 'listening on http' "$f" 2>/dev/null; then
      sed -n 's|.*listening on https\{0,1\}://[^:]*:\([0-9]*\).*|\1|p' "$f" | head -1
      return
    fi
    sleep 0.1
  done
  echo "no listening line in $f" >&2
  exit 1
}

# Completion requests the gateway at URL $1 has answered so far; the other
# arguments go to curl (e.g. --cacert for a TLS gateway).
answered() {
  local url=$1
  shift
  curl -s "$@" "$url/metrics" |
    awk '/^pdgate_requests_total/ { n += $NF } END { printf "%d", n }'
}
