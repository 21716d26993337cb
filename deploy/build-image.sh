#!/usr/bin/env bash
# Builds the container image from deploy/Dockerfile and checks it serves,
# on a machine with no container daemon and no access to a registry (only
# Debian's package mirror), as on the development machine:
#   1. a debian:12 base image made with debootstrap (tagged as the
#      Dockerfile's FROM names, so nothing is pulled);
#   2. `buildah bud --isolation chroot` (no daemon, no OCI runtime);
#   3. a smoke run of the image: two pdgate-sims and pdgate inside it, a
#      chat completion through P/D and /readyz from the host.
# With Docker or Podman and a registry, `docker build -f deploy/Dockerfile
# -t pdgate .` is all it takes; this script is the fallback.
#
#   bash deploy/build-image.sh [--tag localhost/pdgate:dev] [--no-base] [--no-smoke]
# Needs root; installs buildah, podman (for `import`) and debootstrap if
# missing. ~15 min on 2 cores.
set -euo pipefail

tag=localhost/pdgate:dev
base=1
smoke=1
while (($#)); do
  case "$1" in
    --tag) tag=$2; shift ;;
    --no-base) base=0 ;;
    --no-smoke) smoke=0 ;;
    -h | --help) sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-image.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

if ! command -v buildah >/dev/null || ! command -v podman >/dev/null ||
  ! command -v debootstrap >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah podman debootstrap
fi

if ((base)) && ! buildah inspect --type image docker.io/library/debian:12 >/dev/null 2>&1; then
  rootfs=$(mktemp -d)
  trap 'rm -rf "$rootfs"' EXIT
  debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian
  # The Dockerfile's two FROM lines; a minbase system serves as both.
  tar -C "$rootfs" -c . | podman import - docker.io/library/debian:12
  buildah tag docker.io/library/debian:12 docker.io/library/debian:12-slim
fi

buildah bud --isolation chroot --pull=never -f "$ROOT/deploy/Dockerfile" -t "$tag" "$ROOT"

if ((smoke)); then
  c=$(buildah from --pull=never "$tag")
  log=$(mktemp)
  cleanup() {
    [[ -z ${run_pid:-} ]] || kill "$run_pid" 2>/dev/null || true
    wait 2>/dev/null || true
    buildah rm "$c" >/dev/null 2>&1 || true
    rm -f "$log"
  }
  trap cleanup EXIT
  buildah run --isolation chroot $c -- id
  buildah run --isolation chroot $c -- /opt/pdgate/bin/pdgate --version
  # Fixed loopback ports: the container shares the host's network here.
  timeout 30 buildah run --isolation chroot --network host "$c" -- sh -c '
    /opt/pdgate/bin/pdgate-sim --role prefill --port 18101 --log-level warn &
    /opt/pdgate/bin/pdgate-sim --role decode --port 18201 --log-level warn &
    sleep 1
    exec /opt/pdgate/bin/pdgate --port 18001 --prefill 127.0.0.1:18101 \
      --decode 127.0.0.1:18201 --log-level warn' > "$log" 2>&1 &
  run_pid=$!
  for _ in $(seq 50); do
    curl -fsS -m 1 http://127.0.0.1:18001/readyz >/dev/null 2>&1 && break
    sleep 0.2
  done
  curl -fsS -m 5 http://127.0.0.1:18001/v1/chat/completions -H 'content-type: application/json' \
    -d '{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":3}'
  echo
  curl -fsS -m 5 http://127.0.0.1:18001/readyz
  echo
  echo "build-image.sh: $tag built and served a request"
fi
