#!/usr/bin/env bash
# Build gVisor's runsc from the Go module proxy at a pinned version, install it, and
# register it with the local Docker engine as the runtime "runsc", with the flags of
# RUNTIME_ARGS below (each says why). Idempotent: a runsc of the pinned version
# already installed is not built again, and an engine that already has the runtime
# as below is not touched.
#
# As root it installs and registers, saying so in one line each; otherwise it builds
# into the cache and prints the exact steps that need root.
#
# Environment:
#   GVISOR_VERSION   the gvisor.dev/gvisor module version (the Makefile pins it)
#   RUNSC_PATH       where runsc is installed (default /usr/local/bin/runsc)
#   RUNSC_NAME       the runtime's name in the engine (default runsc)
#   DAEMON_JSON      the engine's configuration (default /etc/docker/daemon.json)
#   JAZZMINE_CACHE   where built binaries are kept (default ~/.cache/jazzmine)
#   GO               the go command (default go)
set -euo pipefail

GVISOR_VERSION="${GVISOR_VERSION:?GVISOR_VERSION must name the gvisor.dev/gvisor version (make gvisor sets it)}"
RUNSC_PATH="${RUNSC_PATH:-/usr/local/bin/runsc}"
RUNSC_NAME="${RUNSC_NAME:-runsc}"
DAEMON_JSON="${DAEMON_JSON:-/etc/docker/daemon.json}"
CACHE="${JAZZMINE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/jazzmine}"
GO="${GO:-go}"

# The engine runs every runsc container with these flags (runtimeArgs):
#   --platform=systrap  the default platform, named: KVM hung containers for good on
#                       a nested VM without VMX, ptrace is slower
#   --network=none      gVisor's own network stack with loopback only: a sandbox has
#                       no network, and its egress relay listens on 127.0.0.1
#   --host-uds=open     a sandbox may connect to a Unix socket of its mounts (the
#                       egress proxy's, in its read-only volume); none may be created
#   --oci-seccomp       gVisor's kernel applies the container's seccomp profile to
#                       the script's system calls too (the profile sandboxpool gives)
RUNTIME_ARGS=(--platform=systrap --network=none --host-uds=open --oci-seccomp)

log() { printf 'gvisor: %s\n' "$*" >&2; }
die() { printf 'gvisor: error: %s\n' "$*" >&2; exit 1; }

root=false
[ "$(id -u)" = 0 ] && root=true

# --- runsc ---------------------------------------------------------------------

installed_version() { "$1" --version 2>/dev/null | sed -n 's/^runsc version //p' | head -n1; }

built="$CACHE/runsc-$GVISOR_VERSION"
if [ "$(installed_version "$RUNSC_PATH")" = "$GVISOR_VERSION" ]; then
  log "$RUNSC_PATH is runsc $GVISOR_VERSION already"
  built="$RUNSC_PATH"
else
  if [ "$(installed_version "$built")" != "$GVISOR_VERSION" ]; then
    command -v "$GO" >/dev/null 2>&1 || die "the go command is needed to build runsc ($GO)"
    log "building runsc $GVISOR_VERSION from the Go module proxy into $built (a few minutes)"
    mkdir -p "$CACHE"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    # Outside any module (an empty directory, no workspace), so that the project's
    # go.mod never sees gVisor. Static: a runsc linked to the C library fails every
    # container ("error executing umounter: fork/exec /proc/self/exe: no such file or
    # directory").
    (cd "$tmp" && CGO_ENABLED=0 GOBIN="$tmp/bin" GOWORK=off \
      "$GO" install -trimpath -ldflags "-s -w -X gvisor.dev/gvisor/runsc/version.version=$GVISOR_VERSION" \
      "gvisor.dev/gvisor/runsc@$GVISOR_VERSION") || die "go install gvisor.dev/gvisor/runsc@$GVISOR_VERSION failed"
    mv "$tmp/bin/runsc" "$built"
  fi
  if $root; then
    log "installing runsc $GVISOR_VERSION as $RUNSC_PATH"
    install -D -m 0755 "$built" "$RUNSC_PATH"
    built="$RUNSC_PATH"
  fi
fi

# --- the engine ----------------------------------------------------------------

# The runtime's entry as it should be, and whether daemon.json has it: python3 (which
# the project needs anyway) merges it in, keeping every other key and runtime.
merge_py='
import json, os, sys
path, name, binary, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
want = {"path": binary, "runtimeArgs": args}
try:
    with open(path) as f:
        cfg = json.load(f)
except FileNotFoundError:
    cfg = {}
if cfg.get("runtimes", {}).get(name) == want:
    sys.exit(0)
if os.environ.get("DRY") == "1":
    print(json.dumps({"runtimes": {name: want}}, indent=2))
    sys.exit(10)
cfg.setdefault("runtimes", {})[name] = want
tmp = path + ".jazzmine.tmp"
with open(tmp, "w") as f:
    json.dump(cfg, f, indent=2)
    f.write("\n")
if os.path.exists(path):
    os.chmod(tmp, os.stat(path).st_mode & 0o7777)
os.replace(tmp, path)
sys.exit(10)
'

engine_has_it() {
  docker info --format '{{json .Runtimes}}' 2>/dev/null | python3 -c '
import json, sys
rt = json.load(sys.stdin).get(sys.argv[1]) or {}
sys.exit(0 if rt.get("path") == sys.argv[2] and rt.get("runtimeArgs") == sys.argv[3:] else 1)' "$RUNSC_NAME" "$RUNSC_PATH" "${RUNTIME_ARGS[@]}"
}

command -v docker >/dev/null 2>&1 || die "the docker CLI is not installed"
docker version --format '{{.Server.Version}}' >/dev/null 2>&1 || die "cannot reach the Docker engine"
if engine_has_it; then
  log "the engine has the runtime $RUNSC_NAME ($RUNSC_PATH ${RUNTIME_ARGS[*]})"
  exit 0
fi

if ! $root; then
  fragment=$(DRY=1 python3 -c "$merge_py" "$DAEMON_JSON" "$RUNSC_NAME" "$RUNSC_PATH" "${RUNTIME_ARGS[@]}" || true)
  cat >&2 <<EOF
gvisor: runsc is built ($built); installing it and registering it with the engine needs root:
  sudo install -m 0755 $built $RUNSC_PATH
  # merge into $DAEMON_JSON, keeping its other keys:
$(printf '%s\n' "$fragment" | sed 's/^/  /')
  sudo kill -HUP \$(pidof dockerd)    # a reload: no container is stopped
EOF
  exit 1
fi

pid=$(pidof dockerd || true)
[ -n "$pid" ] || die "no dockerd process on this machine to reload: add the runtime to the engine's configuration by hand"
set +e
python3 -c "$merge_py" "$DAEMON_JSON" "$RUNSC_NAME" "$RUNSC_PATH" "${RUNTIME_ARGS[@]}"
rc=$?
set -e
case $rc in
  0|10) ;;
  *) die "could not merge the runtime into $DAEMON_JSON" ;;
esac
log "registering the runtime $RUNSC_NAME in $DAEMON_JSON and reloading dockerd (SIGHUP: no container is stopped)"
kill -HUP "$pid"
for _ in $(seq 100); do
  engine_has_it && exit 0
  sleep 0.1
done
die "dockerd did not take the runtime $RUNSC_NAME after its reload; see its log (journalctl -u docker)"
