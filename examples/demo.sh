#!/usr/bin/env bash
# make demo: start a worker (embedded NATS), submit the example jobs, show their
# events, stop the worker, and check that it left no container behind.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=./bin/worker
port=${DEMO_NATS_PORT:-4223}
store=$(mktemp -d)
log=$(mktemp)
worker_id="demo-$$"
url="nats://127.0.0.1:$port"

cleanup() {
  if [ -n "${pid:-}" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$store" "$log"
}
trap cleanup EXIT

echo "demo: starting the worker (embedded NATS on 127.0.0.1:$port, log in $log)"
env -u NATS_URL "$bin" serve --config examples/config.yaml --nats-listen "127.0.0.1:$port" --store-dir "$store" --worker-id "$worker_id" --metrics-addr 127.0.0.1:0 >"$log" 2>&1 &
pid=$!
started=$SECONDS
shown=0 # lines of the log looked at
# wait_for SANDBOX: wait until the worker serves the sandbox (each serves once its
# image is built and its containers warm; a first start builds the images).
wait_for() {
  local sb=$1
  for _ in $(seq 1 3000); do
    # The build's progress, as the worker writes it (a line a step).
    local n; n=$(wc -l <"$log")
    if [ "$n" -gt "$shown" ]; then
      sed -n "$((shown + 1)),${n}p" "$log" | grep '^imagebuild: ' | sed 's/^/   /' || true
      shown=$n
    fi
    grep -q "msg=\"sandbox serving\" worker_id=$worker_id sandbox=$sb\$" "$log" && {
      echo "demo: sandbox $sb serves, $((SECONDS - started)) s after the worker started"; return; }
    if grep -q "msg=\"the sandbox is not served.* sandbox=$sb " "$log" || ! kill -0 "$pid" 2>/dev/null; then
      echo "demo: the worker does not serve sandbox $sb:"; cat "$log"; exit 1
    fi
    sleep 0.2
  done
  echo "demo: sandbox $sb did not serve within 10 minutes:"; cat "$log"; exit 1
}
wait_for default

run() { # run EXPECTED_EXIT TITLE ARGS...
  local want=$1 title=$2; shift 2
  echo
  echo "== $title"
  local got=0
  NATS_URL=$url "$bin" submit "$@" || got=$?
  if [ "$got" != "$want" ]; then
    echo "demo: '$title' exited $got, want $want"; exit 1
  fi
}
run 0 "a result, intermediates, logs and printed output" examples/jobs/1_result.py
run 0 "an async tool called as a plain function" examples/jobs/2_async_tool.py
run 1 "an exception, with the script's traceback" examples/jobs/3_exception.py
run 1 "a timeout" --timeout 1 examples/jobs/4_timeout.py
run 0 "the same, as raw JSON events (what an agent reads)" --json --encoding json -e 'emit_result({"ok": True})'
wait_for datascience
out=demo-out # kept after the demo, to look at the chart
rm -rf "$out"
run 0 "a CSV in, a table and a chart out (pandas and matplotlib)" --sandbox datascience \
  --file examples/data/sales.csv:data/sales.csv --out "$out" examples/jobs/5_csv_chart.py
echo "   kept in $out/ after the demo: $(cd "$out" && find . -type f | sort | tr '\n' ' ')"

echo
echo "demo: stopping the worker"
kill -TERM "$pid"
wait "$pid" || { echo "demo: the worker exited with an error:"; cat "$log"; exit 1; }
pid=
left=$(docker ps -aq --filter "label=jazzmine.worker=$worker_id" | wc -l)
if [ "$left" != 0 ]; then
  echo "demo: $left container(s) of the worker are left"; exit 1
fi
echo "demo: done; no container left behind"
