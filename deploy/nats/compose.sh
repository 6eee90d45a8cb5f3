#!/usr/bin/env bash
# Runs docker-compose.yml (three NATS nodes, two workers) under the project name
# jazzmine (COMPOSE_PROJECT_NAME changes it). `make compose-up` and `make compose-down`
# call it after building the images.
#
#   compose.sh up     render run/worker.yaml, make the nkeys (once), start
#                     everything, wait until both workers serve, print how an agent
#                     submits (NATS_URL and its seed)
#   compose.sh down   stop and remove the containers (the workers remove their
#                     sandboxes); the JetStream volumes are kept (WIPE=1 removes them)
#   compose.sh ps | logs [service...]
#
# Environment: JAZZMINE_DATA_DIR, the host directory sandboxes see at /data (default
# deploy/nats/data, created world-writable: sandboxes run as uid 10001);
# JAZZMINE_RUN_DIR, where the rendered config and the keys go (default
# deploy/nats/run);
# JAZZMINE_NATS_PORT_1..3, the loopback ports of the nodes (4222, 4223, 4224);
# NATS_IMAGE and WORKER_IMAGE, the images (nats:<version>, jazzmine-worker:latest);
# WAIT_SECONDS, how long `up` waits for the workers (300).
#
# Keys: the nodes enforce auth.conf. `up` makes a user nkey for the workers and one
# for the tenant agents in the run directory with the worker image's `worker nkey`
# (worker.seed and agent.seed, mode 0600, owned by whoever runs this; worker.pub and
# agent.pub), and keeps them from then on. The nodes get the public keys in their
# environment, the workers worker.seed (NATS_NKEY); agents connect with agent.seed.
# Delete the run directory's *.seed to make new keys at the next `up`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export COMPOSE_PROJECT_NAME=${COMPOSE_PROJECT_NAME:-jazzmine}

log() { printf 'compose: %s\n' "$*" >&2; }
die() { printf 'compose: error: %s\n' "$*" >&2; exit 1; }

compose() {
  if command -v docker-compose >/dev/null 2>&1; then
    docker-compose --file "$here/docker-compose.yml" "$@"
  else
    docker compose --file "$here/docker-compose.yml" "$@"
  fi
}

# render writes run/worker.yaml with the data directory's absolute host path, which
# host_path_map needs and which the compose file cannot give it.
render() {
  local data=${JAZZMINE_DATA_DIR:-$here/data}
  if [ ! -d "$data" ]; then
    mkdir -p "$data"
    chmod 0777 "$data"
  fi
  data=$(cd "$data" && pwd)
  export JAZZMINE_DATA_DIR=$data
  local run=${JAZZMINE_RUN_DIR:-$here/run}
  mkdir -p "$run"
  run=$(cd "$run" && pwd)
  export JAZZMINE_RUN_DIR=$run
  export JAZZMINE_CONFIG=$run/worker.yaml
  sed "s|@HOST_DATA_DIR@|$data|" "$here/worker.yaml" >"$JAZZMINE_CONFIG"
  log "sandboxes mount $data at /data (host_path_map /data: $data)"
  export JAZZMINE_WORKER_SEED=$run/worker.seed
  export JAZZMINE_WORKER_NKEY="" JAZZMINE_AGENT_NKEY=""
  if [ -f "$run/worker.pub" ] && [ -f "$run/agent.pub" ]; then
    JAZZMINE_WORKER_NKEY=$(cat "$run/worker.pub")
    JAZZMINE_AGENT_NKEY=$(cat "$run/agent.pub")
  fi
}

# keys makes the workers' and the agents' nkeys in the run directory, where seeds
# already there are kept, with the worker image (`worker nkey`, run as the caller's
# uid so that the seeds are the caller's), and exports their public keys for the
# nodes.
keys() {
  local run=$JAZZMINE_RUN_DIR
  if [ -f "$run/worker.seed" ] && [ -f "$run/agent.seed" ]; then
    log "keeping the nkeys in $run (worker.seed, agent.seed)"
  else
    log "making the nkeys in $run (worker.seed, agent.seed)"
  fi
  docker run --rm --network none --user "$(id -u):$(id -g)" \
    --volume "$run:/keys" "${WORKER_IMAGE:-jazzmine-worker:latest}" \
    nkey --out /keys worker agent >/dev/null \
    || die "could not make the nkeys with ${WORKER_IMAGE:-jazzmine-worker:latest} (make worker-image builds it)"
  JAZZMINE_WORKER_NKEY=$(cat "$run/worker.pub")
  JAZZMINE_AGENT_NKEY=$(cat "$run/agent.pub")
}

nats_url() {
  echo "nats://127.0.0.1:${JAZZMINE_NATS_PORT_1:-4222},nats://127.0.0.1:${JAZZMINE_NATS_PORT_2:-4223},nats://127.0.0.1:${JAZZMINE_NATS_PORT_3:-4224}"
}

case "${1:-}" in
up)
  render
  keys
  compose up -d
  log "waiting for both workers to serve (the first start builds the sandbox image)"
  deadline=$((SECONDS + ${WAIT_SECONDS:-300}))
  for w in worker-1 worker-2; do
    until compose logs --no-color "$w" 2>/dev/null | grep -q '"msg":"serving"'; do
      if [ $SECONDS -ge $deadline ]; then
        compose logs --no-color --tail 30 "$w" >&2 || true
        die "$w does not serve yet; see: $0 logs $w"
      fi
      sleep 2
    done
  done
  log "serving. Submit a job, as an agent of the tenant agents, with:"
  echo "NATS_URL=$(nats_url) ./bin/worker submit --nkey $JAZZMINE_RUN_DIR/agent.seed -e 'emit_result(6*7)'"
  ;;
down)
  render # the compose file names run/worker.yaml and the data directory
  if [ "${WIPE:-0}" = 1 ]; then
    compose down --volumes
  else
    compose down
  fi
  ;;
ps | logs)
  render
  compose "$@"
  ;;
*)
  die "usage: compose.sh up|down|ps|logs [service...]"
  ;;
esac
