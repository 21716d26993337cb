#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) with clang and runs each one for
# a bounded time over a copy of its checked-in corpus. Exits non-zero if any
# target finds a crash, a leak, a timeout or an out-of-memory input, and
# prints where the reproducer is.
#
# Usage: bash scripts/fuzz.sh [--seconds N] [--target NAME]... [--merge] [--jobs N] [--no-deps]
#   --seconds N   time per target (default 60)
#   --target NAME only this target (repeatable): request, redis_reply,
#                 json_body, sse, command_line, lua_sandbox, kv_index_record,
#                 dns_answer, trace_context, kv_events, url, engine_response,
#                 registry_document, client_keys, load_report, engine_metrics
#   --merge       fold new coverage-increasing inputs back into the
#                 checked-in corpora (never done otherwise)
#   --jobs N      targets fuzzed at once (default: the number of cores)
# A longer run, e.g. before a release: bash scripts/fuzz.sh --seconds 3600
# Reproduce a finding: build-fuzz/tests/fuzz/fuzz_NAME path/to/crash-file
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
seconds=60
merge=0
deps=1
jobs=$(nproc)
targets=()
while (($#)); do
  case "$1" in
    --seconds) seconds=$2; shift ;;
    --target) targets+=("$2"); shift ;;
    --merge) merge=1 ;;
    --jobs) jobs=$2; shift ;;
    --no-deps) deps=0 ;;
    *) echo "fuzz.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
((${#targets[@]})) || targets=(request redis_reply json_body sse command_line lua_sandbox kv_index_record dns_answer
  trace_context kv_events url engine_response registry_document client_keys load_report
  engine_metrics)

# Target -> corpus folder under tests/fuzz/corpus.
corpus_of() {
  case "$1" in
    json_body) echo json ;;
    lua_sandbox) echo lua ;;
    *) echo "$1" ;;
  esac
}

if ((deps)); then
  bash scripts/install-deps.sh
  # clang and its fuzzer runtime, from Debian.
  missing=()
  for pkg in clang libclang-rt-14-dev; do
    dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null | grep -q '^ii' || missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    SUDO=(); [[ $(id -u) == 0 ]] || SUDO=(sudo)
    "${SUDO[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq "${missing[@]}"
  fi
fi

BUILD=${FUZZ_BUILD_DIR:-$ROOT/build-fuzz}
mkdir -p "$BUILD"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DPDGATE_FUZZ=ON -DPDGATE_BUILD_TESTS=OFF > "$BUILD/configure.log" 2>&1 ||
  { cat "$BUILD/configure.log"; exit 1; }
ninja -C "$BUILD" $(printf 'fuzz_%s ' "${targets[@]}")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# run_one T: fuzzes target T; its exit status says whether it found nothing.
run_one() {
  local t=$1
  local bin="$BUILD/tests/fuzz/fuzz_$t"
  local corpus="$work/$t"
  mkdir -p "$corpus" "$work/$t-artifacts"
  cp "$ROOT/tests/fuzz/corpus/$(corpus_of "$t")"/* "$corpus"/
  # -timeout: one input may take at most 10 s (a hang is a finding);
  # -rss_limit_mb: the process stays under 2 GiB; -max_len: inputs the
  # size of real requests and replies.
  "$bin" "$corpus" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -max_len=8192 -print_final_stats=1 -artifact_prefix="$work/$t-artifacts/" \
    > "$work/$t.log" 2>&1
}

# Targets run side by side, one per core: each is one process fuzzing one
# parser for the whole time, so running them together gives each target
# the same time and the run as a whole a fraction of it. Reports follow in
# the targets' order once all are done.
echo "fuzz.sh: ${#targets[@]} target(s), ${seconds}s each, $jobs at a time"
declare -A pid_of
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
  run_one "$t" &
  pid_of[$t]=$!
done

passed=0
failed=0
for t in "${targets[@]}"; do
  bin="$BUILD/tests/fuzz/fuzz_$t"
  seeds="$ROOT/tests/fuzz/corpus/$(corpus_of "$t")"
  echo "== fuzz_$t: ${seconds}s over $(ls "$seeds" | wc -l) seed(s)"
  if wait "${pid_of[$t]}"; then
    grep -E '^#[0-9]+ *DONE|stat::number_of_executed_units' "$work/$t.log" | tail -2
    passed=$((passed + 1))
    if ((merge)); then
      "$bin" -merge=1 "$seeds" "$work/$t" > /dev/null 2>&1
      echo "   merged into $seeds"
    fi
  else
    failed=$((failed + 1))
    keep="$ROOT/build-fuzz-findings/$t"
    mkdir -p "$keep"
    cp "$work/$t-artifacts/"* "$keep"/ 2>/dev/null || true
    cp "$work/$t.log" "$keep/fuzz.log"
    echo "!! fuzz_$t FAILED; last lines of its log:"
    tail -40 "$work/$t.log"
    echo "!! reproducer(s) kept in $keep: $(ls "$keep" | tr '\n' ' ')"
    echo "!! reproduce: $bin $keep/<file>"
  fi
done
echo "fuzz.sh: $passed passed, $failed failed"
((failed == 0))
