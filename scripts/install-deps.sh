#!/usr/bin/env bash
# Installs, from Debian 12's own packages, everything needed to build, test
# and demo pdgate. Idempotent and fast on a re-run: packages already
# installed are skipped, and `apt-get update` runs only when something is
# missing. Works as root, or through sudo otherwise.
#
# Usage: bash scripts/install-deps.sh
set -euo pipefail

PACKAGES=(
  # Toolchain.
  build-essential g++ cmake ninja-build ccache pkg-config clang-format
  # Libraries (see cmake/PdgateDeps.cmake).
  libboost1.81-dev libboost-url1.81-dev libluajit-5.1-dev nlohmann-json3-dev
  libhiredis-dev libspdlog-dev libyaml-cpp-dev libssl-dev
  # The gateway's allocator (cmake/PdgateDeps.cmake).
  libmimalloc-dev
  # ZeroMQ: KV cache events, as vLLM publishes them.
  libzmq3-dev cppzmq-dev
  # Tests and benchmarks.
  googletest libgtest-dev libgmock-dev libbenchmark-dev redis-server
  # The Sentinel failover test (Redis behind redis+sentinel://).
  redis-sentinel
  # The DNS discovery test (a real DNS server whose records it changes).
  dnsmasq-base
  # The HA test and examples/ha (HAProxy in front of two replicas).
  haproxy
  # The dashboard test: Prometheus scrapes a gateway.
  prometheus
  # Demo and the Node SDK test.
  curl
  # The TLS tests make their certificates with the openssl command.
  openssl
  # The routing benchmark's trace tools and their test (tests/bench).
  python3
  # The KV events wire-format test: an independent subscriber (tests/sim).
  python3-zmq python3-msgpack
)

log() { printf 'install-deps: %s\n' "$*" >&2; }

is_installed() {
  [[ "$(dpkg-query -W -f='${db:Status-Abbrev}' "$1" 2>/dev/null)" == ii* ]]
}

missing=()
for pkg in "${PACKAGES[@]}"; do
  is_installed "$pkg" || missing+=("$pkg")
done

# Node.js and npm: Debian's `nodejs` + `npm` packages unless a Node.js with
# npm is already there. A NodeSource `nodejs` bundles npm and conflicts with
# Debian's `npm` package, so asking apt for it would break that setup.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  is_installed nodejs || missing+=(nodejs)
  if ! command -v npm >/dev/null 2>&1 && ! is_installed npm; then
    missing+=(npm)
  fi
fi

# kubectl renders deploy/kubernetes (`kubectl kustomize`, offline) for the
# manifests' check: Debian's kubernetes-client unless a kubectl is there
# (one from elsewhere owns /usr/bin/kubectl too).
if ! command -v kubectl >/dev/null 2>&1; then
  is_installed kubernetes-client || missing+=(kubernetes-client)
fi

if ((${#missing[@]} == 0)); then
  log "all packages already installed"
  exit 0
fi

SUDO=()
if [[ "$(id -u)" -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
  else
    log "not root and sudo is missing; install as root: apt-get install ${missing[*]}"
    exit 1
  fi
fi

export DEBIAN_FRONTEND=noninteractive
log "installing: ${missing[*]}"
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
  "${missing[@]}"
log "done"
