#!/usr/bin/env bash
# Record IPython's answers to cells.json into reference.json (see README.md beside it):
# builds jazzmine-ipython-reference:bookworm from the Dockerfile here unless it exists
# with the same packages (FROM the sandboxes' base image, with the datascience
# sandbox's apt_packages from examples/config.yaml and Debian's ipython3), then runs
# record.py in a container as the sandbox runs scripts: uid 1000, a read-only root, a
# tmpfs /tmp, no network.
#
# Environment:
#   REFERENCE_IMAGE     image to build and run (default jazzmine-ipython-reference:bookworm)
#   BASE_IMAGE          its base (default jazzmine-python-base:bookworm; make base-image
#                       builds it)
#   GO                  the go command that reads the packages from the config (default go)
#   REBUILD=1           rebuild the reference image although it exists (not FORCE,
#                       which make passes on to the base image's build.sh)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../../.." && pwd)
REFERENCE_IMAGE="${REFERENCE_IMAGE:-jazzmine-ipython-reference:bookworm}"
BASE_IMAGE="${BASE_IMAGE:-jazzmine-python-base:bookworm}"
GO="${GO:-go}"

log() { printf 'ipython-reference: %s\n' "$*" >&2; }
die() { printf 'ipython-reference: error: %s\n' "$*" >&2; exit 1; }

packages=$(cd "$root" && "$GO" run ./cmd/worker/testdata/ipython/aptpackages.go -config examples/config.yaml -sandbox datascience) \
  || die "could not read the datascience sandbox's apt_packages from examples/config.yaml"
label=jazzmine.ipyref.packages
built_with=$(docker image inspect --format "{{index .Config.Labels \"$label\"}}" "$REFERENCE_IMAGE" 2>/dev/null || true)
if [ "${REBUILD:-0}" = 1 ] || [ "$built_with" != "$packages" ]; then
  docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 \
    || die "$BASE_IMAGE is missing: make base-image builds it"
  old_id=$(docker image inspect --format '{{.Id}}' "$REFERENCE_IMAGE" 2>/dev/null || true)
  log "building $REFERENCE_IMAGE from $BASE_IMAGE with $packages and Debian's ipython3"
  docker build --quiet --build-arg "BASE=$BASE_IMAGE" --build-arg "PACKAGES=$packages" \
    --label jazzmine.test=ipyref --label "$label=$packages" \
    -t "$REFERENCE_IMAGE" "$here" >/dev/null
  new_id=$(docker image inspect --format '{{.Id}}' "$REFERENCE_IMAGE")
  # A rebuild leaves the previous image untagged; drop it if nothing uses it.
  if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ]; then
    docker image rm "$old_id" >/dev/null 2>&1 || log "previous image $old_id kept (still in use)"
  fi
fi

out=$(mktemp "$here/.reference.json.XXXXXX")
trap 'rm -f "$out"' EXIT
log "recording $(grep -c '"name":' "$here/cells.json") cells with $REFERENCE_IMAGE"
docker run --rm --label jazzmine.test=ipyref \
  --network none --user 1000:1000 --read-only --tmpfs /tmp \
  -e HOME=/tmp -e IPYTHONDIR=/tmp/.ipython \
  -v "$here:/ipython:ro" \
  "$REFERENCE_IMAGE" python3 /ipython/record.py --cells /ipython/cells.json --out - >"$out"
chmod 644 "$out"
mv "$out" "$here/reference.json"
trap - EXIT
log "wrote $here/reference.json"
