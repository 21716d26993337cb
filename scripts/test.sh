#!/usr/bin/env bash
# Installs the dependencies, builds pdgate with its tests and runs them all:
# every ctest test (unit, sim, integration; integration tests start their
# own engines and gateways) and the OpenAI Node SDK test in tests/node.
# Exits non-zero on any failure.
#
# Usage: bash scripts/test.sh [--sanitize] [--no-deps] [-- CTEST_ARGS...]
#   --sanitize  ASan + UBSan build in build-asan/, the whole suite under it
#   --no-deps   skip scripts/install-deps.sh (packages already installed)
#   -- ARGS     extra ctest arguments, e.g. -- -R Pipeline -L integration
# Environment: BUILD_DIR overrides the build tree; JOBS the build parallelism;
# CTEST_JOBS the number of tests run at once (2); CTEST_TIMEOUT the default
# per-test timeout in seconds for tests that set none (300).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
sanitize=0
deps=1
ctest_extra=()

usage() { sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

while (($#)); do
  case "$1" in
    --sanitize) sanitize=1 ;;
    --no-deps) deps=0 ;;
    -h | --help) usage; exit 0 ;;
    --) shift; ctest_extra=("$@"); break ;;
    *) echo "test.sh: unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

section() { printf '\n==== test.sh: %s ====\n' "$*"; }

build_args=()
if ((sanitize)); then
  build_dir="${BUILD_DIR:-$ROOT/build-asan}"
  build_args+=(--sanitize)
  # Leaks are reported at exit; UBSan stops at the first finding so a test
  # fails instead of printing a warning nobody reads.
  export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:check_initialization_order=1}"
  export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
else
  build_dir="${BUILD_DIR:-$ROOT/build}"
fi
build_args+=(--build-dir "$build_dir")

if ((deps)); then
  section "dependencies"
  bash "$ROOT/scripts/install-deps.sh"
fi

# The Node tests' packages, before configuring: tests/node (the OpenAI SDK)
# and tests/deploy/kubernetes (the manifests' schema check) register their
# ctest entries only when node_modules is there.
node_dir="$ROOT/tests/node"
have_node=0
if [[ -f "$node_dir/package.json" ]] && command -v node >/dev/null 2>&1; then
  have_node=1
  for dir in "$node_dir" "$ROOT/tests/deploy/kubernetes"; do
    if [[ ! -d "$dir/node_modules" || "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ]]; then
      section "npm ci (${dir#"$ROOT"/})"
      (cd "$dir" && npm ci --no-audit --no-fund)
    fi
  done
fi

section "build ($build_dir)"
bash "$ROOT/scripts/build.sh" "${build_args[@]}" -- -DPDGATE_BUILD_TESTS=ON

status=0
passed=0
failed=0
log="$(mktemp)"
trap 'rm -f "$log"' EXIT

section "ctest"
ctest_args=(--test-dir "$build_dir" --output-on-failure -j "${CTEST_JOBS:-2}"
  --timeout "${CTEST_TIMEOUT:-300}")
ctest_status=0
ctest "${ctest_args[@]}" "${ctest_extra[@]}" 2>&1 | tee "$log" || ctest_status=1
# "96% tests passed, 6 tests failed out of 163"
summary="$(grep -Eo '[0-9]+ tests? failed out of [0-9]+' "$log" | tail -n1 || true)"
if [[ -n "$summary" ]]; then
  read -r f _ _ _ _ total <<<"$summary"
  passed=$((passed + total - f))
  failed=$((failed + f))
fi
if ((ctest_status)); then
  status=1
  # ctest failed without failing a test (e.g. a test binary missing).
  [[ -n "$summary" && "${f:-0}" != 0 ]] || failed=$((failed + 1))
fi

# The Node SDK test runs under ctest once tests/CMakeLists.txt adds
# tests/node; until then run it here (not when ctest was given a filter).
node_in_ctest=0
if ctest --test-dir "$build_dir" -N -R '^node_sdk$' 2>/dev/null | grep -q 'Total Tests: 1'; then
  node_in_ctest=1
fi
if ((have_node)) && ((!node_in_ctest)) && ((${#ctest_extra[@]} == 0)); then
  section "node --test (tests/node, OpenAI Node SDK)"
  node_status=0
  (cd "$node_dir" && PDGATE_BUILD_DIR="$build_dir" node --test sdk.test.mjs) 2>&1 | tee "$log" ||
    node_status=1
  # node's TAP summary: "# pass 8" / "# fail 0"
  p="$(sed -n 's/^# pass \([0-9][0-9]*\)$/\1/p' "$log" | tail -n1)"
  f="$(sed -n 's/^# fail \([0-9][0-9]*\)$/\1/p' "$log" | tail -n1)"
  passed=$((passed + ${p:-0}))
  failed=$((failed + ${f:-0}))
  if ((node_status)); then
    status=1
    # A runner that died before its summary still counts as a failure.
    [[ -n "$f" && "$f" != 0 ]] || failed=$((failed + 1))
  fi
elif ((!have_node)); then
  echo "test.sh: node not found; the Node SDK test was not run" >&2
  status=1
  failed=$((failed + 1))
fi

if ((status)); then
  section "FAILED"
else
  section "all tests passed"
fi
# One plain closing line that any reader of the log can count.
echo "test.sh: $passed passed, $failed failed"
exit "$status"
