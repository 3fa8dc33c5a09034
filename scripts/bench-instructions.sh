#!/usr/bin/env bash
# Instructions per job, counted by valgrind's callgrind in the worker and in
# redis-server: unlike jobs/s they repeat on a busy machine, so two builds
# can be compared (A/B) where timings cannot. See docs/benchmarks.md.
#
#   scripts/bench-instructions.sh                       # this tree's release worker
#   scripts/bench-instructions.sh OLD_WORKER NEW_WORKER # compare builds
#   JOBS=2000 CONCURRENCY="1 10" scripts/bench-instructions.sh
#   PRODUCER=cli scripts/bench-instructions.sh         # jobs from `workerpool enqueue`
#
# PRODUCER=raw (the default) pushes the bare JSON with LPUSH, as most
# producers do; PRODUCER=cli enqueues it with the `workerpool` CLI beside
# each worker binary, which adds `id` and `enqueued_at` last (the form the
# taking scripts stamp without parsing).
# Each run: a fresh redis-server under callgrind, JOBS no-op jobs pushed,
# one worker under callgrind drains them, then both are stopped. A run with
# no jobs gives the fixed cost (start, registration, idle waits), which is
# taken off. Needs valgrind, redis-server and redis-cli.
set -euo pipefail
cd "$(dirname "$0")/.."

JOBS=${JOBS:-5000}
PRODUCER=${PRODUCER:-raw}
CONCURRENCY=${CONCURRENCY:-"1 10"}
QUEUE=bench
TARGET=${CARGO_TARGET_DIR:-target}

for tool in valgrind redis-server redis-cli python3; do
  command -v "$tool" >/dev/null || { echo "$tool not found" >&2; exit 1; }
done
if [ $# -eq 0 ]; then
  cargo build --quiet --release -p workerpool-worker -p workerpool-cli --bins
  set -- "$TARGET/release/workerpool-worker"
fi

tmp=$(mktemp -d)
redis_pid=
worker_pid=
cleanup() {
  if [ -n "$worker_pid" ]; then kill "$worker_pid" 2>/dev/null || true; fi
  if [ -n "$redis_pid" ]; then kill "$redis_pid" 2>/dev/null || true; fi
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

job='{"task":"noop","data":{"user":12345,"template":"welcome","locale":"en"}}'
for ((i = 0; i < JOBS; i++)); do echo "$job"; done >"$tmp/jobs.txt"
# LPUSH commands in the protocol, for redis-cli --pipe.
python3 - "$QUEUE" "$job" "$JOBS" >"$tmp/jobs.resp" <<'EOF'
import sys
queue, job, n = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3])
cmd = b"*3\r\n$5\r\nLPUSH\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(queue), queue.encode(), len(job), job)
sys.stdout.buffer.write(cmd * n)
EOF

# Ir (instructions) in a callgrind output file.
instructions() { awk '/^summary:/ {print $2}' "$1"; }

# run BINARY CONCURRENCY JOBS -> "worker_instructions redis_instructions"
run() {
  local bin=$1 c=$2 n=$3 port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  rm -f "$tmp"/cg.*
  valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.redis" \
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --hz 1 --dir "$tmp" \
    --daemonize no >"$tmp/redis.log" 2>&1 &
  redis_pid=$!
  until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.1; done
  if [ "$n" -gt 0 ] && [ "$PRODUCER" = cli ]; then
    "$(dirname "$bin")/workerpool" enqueue --redis-url "redis://127.0.0.1:$port/0" \
      --queue "$QUEUE" <"$tmp/jobs.txt" >/dev/null
  elif [ "$n" -gt 0 ]; then
    redis-cli -p "$port" --pipe <"$tmp/jobs.resp" >/dev/null
  fi
  valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.worker" \
    "$bin" --redis-url "redis://127.0.0.1:$port/0" --queue "$QUEUE" --handler noop \
    --concurrency "$c" --listen 127.0.0.1:0 --worker-id bench >"$tmp/worker.log" 2>&1 &
  worker_pid=$!
  if [ "$n" -gt 0 ]; then
    until [ "$(redis-cli -p "$port" GET "$QUEUE:stats:processed")" = "$n" ]; do sleep 0.1; done
  else
    until [ "$(redis-cli -p "$port" ZCARD "$QUEUE:workers")" = "1" ]; do sleep 0.1; done
    sleep 1
  fi
  kill -TERM "$worker_pid"
  wait "$worker_pid" || true
  worker_pid=
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$redis_pid" || true
  redis_pid=
  echo "$(instructions "$tmp/cg.worker") $(instructions "$tmp/cg.redis")"
}

printf '%-40s %11s %15s %15s\n' worker concurrency "worker Ir/job" "redis Ir/job"
for bin in "$@"; do
  for c in $CONCURRENCY; do
    read -r w0 r0 < <(run "$bin" "$c" 0)
    read -r w r < <(run "$bin" "$c" "$JOBS")
    printf '%-40s %11s %15s %15s\n' "$bin" "$c" \
      "$(( (w - w0) / JOBS ))" "$(( (r - r0) / JOBS ))"
  done
done
