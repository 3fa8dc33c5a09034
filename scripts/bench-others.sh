#!/usr/bin/env bash
# The same drain as scripts/bench.sh — JOBS preloaded no-op jobs, one worker
# process at each concurrency, jobs/s from the worker's start to the last
# job done — with BullMQ, Celery (threads and prefork), Dramatiq and RQ on
# the same machine and a throwaway redis-server. Installs them under
# target/bench-others (npm and PyPI). Prints one line per runtime and
# concurrency: NAME C JOBS_PER_S.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-20000}
CONCURRENCY=${CONCURRENCY:-"1 10 50"}
dir=target/bench-others
mkdir -p "$dir"
[ -d "$dir/node_modules/bullmq" ] || (cd "$dir" && npm install --silent bullmq@5 >/dev/null)
[ -x "$dir/venv/bin/python" ] || python3 -m venv "$dir/venv"
"$dir/venv/bin/python" -c 'import celery, dramatiq, rq' 2>/dev/null \
  || "$dir/venv/bin/pip" install -q "celery[redis]" "dramatiq[redis]" rq
cp scripts/bench-others/bullmq.js scripts/bench-others/tasks.py "$dir/"

tmp=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cleanup() { redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$tmp"; }
trap cleanup EXIT
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" --daemonize yes >/dev/null
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
export BENCH_REDIS="redis://127.0.0.1:$port/0"
py="$PWD/$dir/venv/bin/python"
cli() { redis-cli -p "$port" "$@"; }
now() { date +%s.%N; }
rate() { awk -v s="$1" -v e="$2" -v n="$JOBS" 'BEGIN { printf "%.0f", n / (e - s) }'; }
# Waits until `cli $@` prints 0. One redis-cli polls every 20 ms and bash
# reads its lines: a process started per poll would take CPU from the
# worker being measured (scripts/bench.sh does the same).
drained() {
  local n
  while read -r n; do [ "$n" = "0" ] && break; done < <(cli -r -1 -i 0.02 "$@")
}

# run_celery POOL C NAME: one Celery worker with POOL (-P) and C slots drains
# the jobs; done when the list and the unacked hash are both empty.
run_celery() {
  cli flushall >/dev/null
  (cd "$dir" && "$py" tasks.py celery "$JOBS")
  local start end pid
  start=$(now)
  (cd "$dir" && exec "$py" -m celery -A tasks worker -P "$1" -c "$2" --without-gossip --without-mingle \
    --without-heartbeat --loglevel=ERROR >/dev/null 2>&1) &
  pid=$!
  drained llen celery; drained hlen unacked
  end=$(now); kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  echo "$3 $2 $(rate "$start" "$end")"
}

for c in $CONCURRENCY; do
  cli flushall >/dev/null
  (cd "$dir" && node bullmq.js "$port" "$JOBS" "$c")

  # Celery's threads pool (acks on receipt, its default), then its prefork
  # pool: c child processes each running the no-op in Python, the model of
  # workerpool's exec handler (HANDLER=exec scripts/bench.sh).
  run_celery threads "$c" celery
  run_celery prefork "$c" celery-prefork

  # Dramatiq: one process with c threads; done when no message is left.
  cli flushall >/dev/null
  (cd "$dir" && "$py" tasks.py dramatiq "$JOBS")
  start=$(now)
  (cd "$dir" && exec "$py" -m dramatiq tasks --processes 1 --threads "$c" >/dev/null 2>&1) &
  pid=$!
  drained hlen dramatiq:default.msgs
  end=$(now); kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  echo "dramatiq $c $(rate "$start" "$end")"
done

# RQ runs one job at a time per worker: concurrency 1 only, without fork.
cli flushall >/dev/null
(cd "$dir" && "$py" tasks.py rq "$JOBS")
start=$(now)
(cd "$dir" && "$py" -m rq.cli worker --burst --worker-class rq.worker.SimpleWorker --url "$BENCH_REDIS" \
  --logging_level ERROR bench >/dev/null 2>&1)
end=$(now)
echo "rq 1 $(rate "$start" "$end")"
