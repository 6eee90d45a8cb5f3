#!/usr/bin/env bash
# Builds the images docker-compose.yml runs, with the classic builder from a
# generated context; no registry is needed.
#
#   images.sh nats     nats:<version>, the version of the nats-server module in go.mod
#                      (nats.Dockerfile: the official image's layout, FROM scratch).
#                      Skipped when the tag exists, pulled or built before (FORCE=1
#                      rebuilds): where the official image can be pulled, pull it
#                      instead.
#   images.sh worker   jazzmine-worker:latest (worker.Dockerfile, FROM scratch) around
#                      bin/worker, which must be static (make build).
#
# Environment: NATS_IMAGE (default nats:<version>), WORKER_IMAGE (default
# jazzmine-worker:latest), WORKER_BINARY (default bin/worker), FORCE=1, GO (default go).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
GO=${GO:-go}

log() { printf 'images: %s\n' "$*" >&2; }
die() { printf 'images: error: %s\n' "$*" >&2; exit 1; }

# context DIR DOCKERFILE: a fresh build context holding the Dockerfile alone; the
# caller adds the files it copies.
ctx=""
cleanup() { if [ -n "$ctx" ]; then rm -rf "$ctx"; fi; }
trap cleanup EXIT
new_context() {
  ctx=$(mktemp -d "${TMPDIR:-/tmp}/jazzmine-image.XXXXXX")
  cp "$1" "$ctx/Dockerfile"
}

build() { # TAG
  DOCKER_BUILDKIT=0 docker build --quiet --tag "$1" "$ctx" >/dev/null
  log "built $1 ($(docker image inspect --format '{{.Id}}' "$1"))"
}

nats_version() {
  (cd "$root" && "$GO" list -m -f '{{.Version}}' github.com/nats-io/nats-server/v2) | sed 's/^v//'
}

case "${1:-}" in
nats)
  tag=${NATS_IMAGE:-nats:$(nats_version)}
  if [ "${FORCE:-0}" != 1 ] && docker image inspect "$tag" >/dev/null 2>&1; then
    log "$tag already exists; nothing to do (FORCE=1 rebuilds)"
    exit 0
  fi
  new_context "$here/nats.Dockerfile"
  cp "$here/nats-server.conf" "$ctx/"
  log "building nats-server $(nats_version) from the Go module"
  (cd "$root" && CGO_ENABLED=0 "$GO" build -trimpath -ldflags '-s -w' -o "$ctx/nats-server" github.com/nats-io/nats-server/v2)
  build "$tag"
  ;;
worker)
  tag=${WORKER_IMAGE:-jazzmine-worker:latest}
  bin=${WORKER_BINARY:-$root/bin/worker}
  [ -x "$bin" ] || die "$bin not found: run make build"
  # The image has no libc: a dynamically linked binary would not start in it.
  # grep reads it all (not -q): an early exit would leave go a SIGPIPE, which
  # pipefail would count as a dynamic build.
  "$GO" version -m "$bin" | grep 'CGO_ENABLED=0' >/dev/null \
    || die "$bin is not a static build (CGO_ENABLED=0); run make build"
  new_context "$here/worker.Dockerfile"
  cp "$bin" "$ctx/worker"
  build "$tag"
  ;;
*)
  die "usage: images.sh nats|worker"
  ;;
esac
