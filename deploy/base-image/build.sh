#!/usr/bin/env bash
# Build the jazzmine Python base image from Debian bookworm packages, without
# any image registry: mmdebstrap builds a root filesystem tarball from the
# Debian mirror the host's apt already uses, and `docker import` turns it into
# an image. See README.md beside this script.
#
# Environment:
#   BASE_IMAGE            tag to build (default jazzmine-python-base:bookworm)
#   EXTRA_PACKAGES        Debian packages to install on top of PACKAGES below,
#                         separated by spaces or commas (default none)
#   EXTRA_ENV             NAME=value words added to the image's ENV (default none)
#   SMOKE_TEST            a Python file the image must run after the import, as
#                         uid 1000 with --read-only --tmpfs /tmp --network none
#   FORCE=1               rebuild even if BASE_IMAGE already exists
#   DEBIAN_MIRROR         override the archive URI read from the host's apt sources
#   DEBIAN_SECURITY_MIRROR  override the security URI ("none" to leave it out)
#   MMDEBSTRAP_MODE       mmdebstrap --mode (default auto: root when run as root)
set -euo pipefail

BASE_IMAGE="${BASE_IMAGE:-jazzmine-python-base:bookworm}"
SUITE=bookworm
COMPONENTS=main
MODE="${MMDEBSTRAP_MODE:-auto}"

# Packages on top of the minbase variant (Essential:yes + Priority:required +
# apt). Recommends are not installed, so python3-pip does not pull in a compiler.
PACKAGES=(
  python3
  python3-pip
  python3-venv
  python3-setuptools
  python3-wheel
  ca-certificates
  procps
)
extra="${EXTRA_PACKAGES:-}"
read -r -a EXTRA <<<"${extra//,/ }"
read -r -a ENVS <<<"${EXTRA_ENV:-}"
SMOKE_TEST="${SMOKE_TEST:-}"

# Must not end up in the image (the sandbox image build removes them anyway;
# the base should not carry them in the first place).
FORBIDDEN=(curl wget nc netcat ncat socat gcc cc c++ g++ make)

log() { printf 'base-image: %s\n' "$*" >&2; }
die() { printf 'base-image: error: %s\n' "$*" >&2; exit 1; }

# --- preflight ---------------------------------------------------------------

command -v docker >/dev/null 2>&1 || die "docker CLI not found"
docker version --format '{{.Server.Version}}' >/dev/null 2>&1 \
  || die "cannot reach the Docker engine (is it running? is DOCKER_HOST right?)"

if [ "${FORCE:-0}" != 1 ] && docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  id=$(docker image inspect --format '{{.Id}}' "$BASE_IMAGE")
  log "$BASE_IMAGE already exists (${id}); nothing to do (FORCE=1 rebuilds)"
  exit 0
fi

for p in "${EXTRA[@]}"; do
  [[ "$p" =~ ^[a-z0-9][a-z0-9+.-]+$ ]] || die "EXTRA_PACKAGES: '$p' is not a Debian package name"
done
for e in "${ENVS[@]}"; do
  [[ "$e" =~ ^[A-Za-z_][A-Za-z0-9_]*=[^\"\\]*$ ]] || die "EXTRA_ENV: '$e' is not NAME=value (no quotes or backslashes)"
done
[ -z "$SMOKE_TEST" ] || [ -f "$SMOKE_TEST" ] || die "SMOKE_TEST: no such file: $SMOKE_TEST"

# mmdebstrap is the one tool this needs beyond Docker: installed here when we are
# root on an apt system (one line says so), else the exact command is printed.
if ! command -v mmdebstrap >/dev/null 2>&1; then
  install_cmd="apt-get update && apt-get install -y --no-install-recommends mmdebstrap"
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "mmdebstrap is not installed: installing it ($install_cmd)"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends mmdebstrap; } >/dev/null \
      || die "could not install mmdebstrap; run: $install_cmd"
  else
    die "mmdebstrap is not installed; install it with: sudo sh -c '$install_cmd'"
  fi
fi

# --- mirrors: read from the host's apt configuration -------------------------

# Prints "URI SUITE" for every enabled binary ("deb") source the host's apt
# uses, from one-line .list files and deb822 .sources files.
host_sources() {
  local files=() f
  [ -f /etc/apt/sources.list ] && files+=(/etc/apt/sources.list)
  for f in /etc/apt/sources.list.d/*.list; do [ -f "$f" ] && files+=("$f"); done
  for f in "${files[@]}"; do
    # deb [opt=val ...] URI SUITE [COMPONENT...]
    sed -e 's/#.*//' -e 's/\[[^]]*\]//' "$f" | awk '$1 == "deb" && NF >= 3 { print $2, $3 }'
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk '
      function flush(   i, j, nu, ns, u, s, t, isdeb) {
        if (enabled != "no" && types != "") {
          isdeb = 0; nt = split(types, t, /[ \t]+/)
          for (i = 1; i <= nt; i++) if (t[i] == "deb") isdeb = 1
          if (isdeb) {
            nu = split(uris, u, /[ \t]+/); ns = split(suites, s, /[ \t]+/)
            for (i = 1; i <= nu; i++) for (j = 1; j <= ns; j++)
              if (u[i] != "" && s[j] != "") print u[i], s[j]
          }
        }
        types = uris = suites = enabled = ""
      }
      /^[ \t]*#/ { next }
      /^[ \t]*$/ { flush(); next }
      /^[ \t]/   { next }                      # continuation line (e.g. an inline key)
      {
        key = tolower($0); sub(/:.*/, "", key)
        val = $0; sub(/^[^:]*:[ \t]*/, "", val); sub(/[ \t]+$/, "", val)
        if (key == "types") types = val
        else if (key == "uris") uris = val
        else if (key == "suites") suites = val
        else if (key == "enabled") enabled = tolower(val)
      }
      END { flush() }
    ' "$f"
  done
}

# First host URI that serves the given suite.
uri_for() { host_sources | awk -v s="$1" '$2 == s { sub(/\/+$/, "", $1); print $1; exit }'; }

archive="${DEBIAN_MIRROR:-$(uri_for "$SUITE")}"
[ -n "$archive" ] || die "no apt source for suite '$SUITE' found in /etc/apt/sources.list{,.d/*}; set DEBIAN_MIRROR=<uri>"
mirrors=("deb $archive $SUITE $COMPONENTS")
if [ -n "${DEBIAN_MIRROR:-}" ] || [ -n "$(uri_for "$SUITE-updates")" ]; then
  mirrors+=("deb $archive $SUITE-updates $COMPONENTS")
fi
security="${DEBIAN_SECURITY_MIRROR:-$(uri_for "$SUITE-security")}"
if [ -n "$security" ] && [ "$security" != none ]; then
  mirrors+=("deb $security $SUITE-security $COMPONENTS")
else
  log "warning: no $SUITE-security source found; building without security updates"
fi

# Carry over host apt settings that mmdebstrap would not see (it uses its own
# apt configuration): proxies, and relaxed Release-date checks for snapshot
# mirrors. They apply to the build only: a customize hook drops them from the
# image's apt configuration again.
aptopts=()
while IFS= read -r line; do
  aptopts+=("--aptopt=$line")
done < <(apt-config dump 2>/dev/null | grep -E '^Acquire::(https?::Proxy|Check-Valid-Until|Check-Date) ' || true)

# --- build -------------------------------------------------------------------

workdir=$(mktemp -d "${TMPDIR:-/tmp}/jazzmine-base-image.XXXXXX")
chmod 755 "$workdir"   # lets apt drop privileges to _apt for downloads
cleanup() {
  # --one-file-system: never descend into anything an interrupted build left mounted.
  rm -rf --one-file-system "$workdir" || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start=$(date +%s)
log "building $BASE_IMAGE from Debian $SUITE (mode $MODE)"
for m in "${mirrors[@]}"; do log "  source: $m"; done
log "  packages: minbase + ${PACKAGES[*]}"
[ ${#EXTRA[@]} -eq 0 ] || log "  extra packages: ${EXTRA[*]}"

forbidden_check='for b in '"${FORBIDDEN[*]}"'; do
  for d in usr/bin usr/sbin bin sbin usr/local/bin; do
    if [ -e "$1/$d/$b" ] || [ -L "$1/$d/$b" ]; then echo "base-image: forbidden binary in image: /$d/$b" >&2; exit 1; fi
  done
done'

TMPDIR="$workdir" mmdebstrap \
  --mode="$MODE" \
  --variant=minbase \
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
  --format=tar \
  --include="$(IFS=,; echo "${PACKAGES[*]}${EXTRA[*]:+,${EXTRA[*]}}")" \
  --aptopt='Acquire::Languages "none"' \
  "${aptopts[@]}" \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/groff/*' \
  --dpkgopt='path-exclude=/usr/share/lintian/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-include=/usr/share/locale/locale.alias' \
  --dpkgopt='path-exclude=/usr/lib/python3*/EXTERNALLY-MANAGED' \
  --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
  --customize-hook='rm -rf "$1"/var/cache/debconf/*-old "$1"/var/lib/dpkg/*-old' \
  --customize-hook='sed -i -E "/^Acquire::(https?::Proxy|Check-Valid-Until|Check-Date) /d" "$1/etc/apt/apt.conf.d/99mmdebstrap"' \
  --customize-hook="$forbidden_check" \
  --customize-hook='dpkg-query --admindir="$1/var/lib/dpkg" -W -f "\${Package} \${Version}\n" python3 python3.11 python3-pip '"${EXTRA[*]}"' > "$1/tmp/jazzmine-versions"' \
  --customize-hook="copy-out /tmp/jazzmine-versions $workdir" \
  "$SUITE" "$workdir/rootfs.tar" "${mirrors[@]}"

[ -s "$workdir/rootfs.tar" ] || die "mmdebstrap produced no tarball"
log "rootfs tarball: $(du -h "$workdir/rootfs.tar" | cut -f1)"

python_version=$(awk '$1 == "python3.11" { print $2 }' "$workdir/jazzmine-versions" 2>/dev/null || true)
pip_version=$(awk '$1 == "python3-pip" { print $2 }' "$workdir/jazzmine-versions" 2>/dev/null || true)
# The extra packages as name=version, for a label.
extra_versions=""
for p in "${EXTRA[@]}"; do
  v=$(awk -v p="$p" '$1 == p { print $2 }' "$workdir/jazzmine-versions" 2>/dev/null || true)
  extra_versions+="${extra_versions:+ }$p=${v:-unknown}"
done
changes=()
[ -z "$extra_versions" ] || changes+=(--change "LABEL jazzmine.base.extra=\"$extra_versions\"")
for e in "${ENVS[@]}"; do changes+=(--change "ENV $e"); done
title="${BASE_IMAGE##*/}"; title="${title%%:*}"
description="Debian $SUITE with python3 and pip${EXTRA[*]:+ and ${EXTRA[*]}}, built by mmdebstrap"

old_id=$(docker image inspect --format '{{.Id}}' "$BASE_IMAGE" 2>/dev/null || true)

log "importing into Docker as $BASE_IMAGE"
new_id=$(docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'ENV PYTHONDONTWRITEBYTECODE=1' \
  --change 'ENV PYTHONUNBUFFERED=1' \
  --change 'ENV PIP_DISABLE_PIP_VERSION_CHECK=1' \
  --change 'ENV PIP_NO_CACHE_DIR=1' \
  --change 'LABEL jazzmine.base=1' \
  --change "LABEL jazzmine.base.suite=$SUITE" \
  --change "LABEL jazzmine.base.python=${python_version:-unknown}" \
  --change "LABEL jazzmine.base.pip=${pip_version:-unknown}" \
  "${changes[@]}" \
  --change "LABEL org.opencontainers.image.title=$title" \
  --change "LABEL org.opencontainers.image.description=\"$description\"" \
  --change 'CMD ["python3"]' \
  --message "jazzmine base image: Debian $SUITE minbase + ${PACKAGES[*]}${EXTRA[*]:+ ${EXTRA[*]}}" \
  "$workdir/rootfs.tar" "$BASE_IMAGE")

# A forced rebuild leaves the previous image untagged; drop it if nothing uses it.
if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ]; then
  if docker image rm "$old_id" >/dev/null 2>&1; then
    log "removed previous image $old_id"
  else
    log "previous image $old_id kept (still in use)"
  fi
fi

# An image that fails a smoke test is untagged again, so that the next run builds it
# rather than finding it.
smoke() {
  "$@" >&2 && return 0
  docker image rm "$BASE_IMAGE" >/dev/null 2>&1 || true
  die "$BASE_IMAGE failed its smoke test; removed it"
}
log "smoke test"
smoke docker run --rm --network none "$BASE_IMAGE" \
  python3 -c 'import sys, pip, ssl, venv; print("python", sys.version.split()[0], "pip", pip.__version__)'
smoke docker run --rm --network none --user 1000:1000 "$BASE_IMAGE" \
  python3 -c 'import os; assert os.getuid() == 1000; print("non-root python3 ok")'
if [ -n "$SMOKE_TEST" ]; then
  log "smoke test: $SMOKE_TEST (uid 1000, read-only root, tmpfs /tmp, no network)"
  smoke docker run --rm -i --network none --read-only --tmpfs /tmp:rw,size=64m --user 1000:1000 "$BASE_IMAGE" \
    python3 - <"$SMOKE_TEST"
fi

size=$(docker image inspect --format '{{.Size}}' "$BASE_IMAGE")
log "built $BASE_IMAGE"
log "  id:   $new_id"
log "  size: $((size / 1000000)) MB / $((size / 1048576)) MiB ($size bytes)"
log "  time: $(( $(date +%s) - start ))s"
