#!/usr/bin/env bash
# Configures and builds pdgate with CMake + Ninja (RelWithDebInfo).
#
# Usage: bash scripts/build.sh [--sanitize] [--build-dir DIR] [--target T]...
#                              [-- CMAKE_ARGS...]
#   --sanitize       ASan + UBSan build (-DPDGATE_SANITIZE=ON), in build-asan/
#   --build-dir DIR  build tree to use (default: build/, or build-asan/ with
#                    --sanitize)
#   --target T       build only target T (repeatable; default: everything)
#   -- ARGS          extra arguments for the CMake configure step, e.g.
#                    -- -DPDGATE_BUILD_TESTS=OFF
# Environment: JOBS overrides the parallelism (default: nproc).
#
# A tree configured here for the first time is a unity build
# (-DPDGATE_UNITY_BUILD=ON: the tests, and with --sanitize everything,
# compiled eight sources to a batch; cmake/PdgateOptions.cmake says why not
# pdgate itself); a tree configured before keeps its setting. While
# editing, -- -DPDGATE_UNITY_BUILD=OFF makes a one-file change recompile
# only that file.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
sanitize=OFF
build_dir=""
extra=()
targets=()

usage() { sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

while (($#)); do
  case "$1" in
    --sanitize) sanitize=ON ;;
    --build-dir)
      [[ $# -ge 2 ]] || { echo "build.sh: --build-dir needs a value" >&2; exit 2; }
      build_dir="$2"
      shift
      ;;
    --build-dir=*) build_dir="${1#*=}" ;;
    --target)
      [[ $# -ge 2 ]] || { echo "build.sh: --target needs a value" >&2; exit 2; }
      targets+=(--target "$2")
      shift
      ;;
    -h | --help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "build.sh: unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

if [[ -z "$build_dir" ]]; then
  if [[ "$sanitize" == ON ]]; then build_dir="$ROOT/build-asan"; else build_dir="$ROOT/build"; fi
fi
jobs="${JOBS:-$(nproc)}"

# A tree configured earlier with another generator cannot be reused by
# `cmake -G Ninja`; start that tree's configuration afresh.
cache="$build_dir/CMakeCache.txt"
if [[ -f "$cache" ]] && ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$cache"; then
  echo "build.sh: $build_dir was configured with another generator; reconfiguring" >&2
  rm -rf "$cache" "$build_dir/CMakeFiles"
fi

fresh=()
[[ -f "$cache" ]] || fresh=(-DPDGATE_UNITY_BUILD=ON)

echo "build.sh: configuring $build_dir (sanitize=$sanitize)" >&2
cmake -S "$ROOT" -B "$build_dir" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DPDGATE_SANITIZE="$sanitize" \
  "${fresh[@]}" "${extra[@]}"
echo "build.sh: building with -j$jobs" >&2
cmake --build "$build_dir" -j "$jobs" "${targets[@]}"
