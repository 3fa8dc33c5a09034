#!/usr/bin/env bash
# What kept outcomes cost (docs/benchmarks.md, "Outcomes"):
#
# 1. Nothing kept: no-op jobs at concurrency 10 and 50, this build against
#    BASE (a commit before outcomes existed), ROUNDS alternating rounds of
#    scripts/bench.sh each; the steady jobs/s of each and their ratio.
# 2. Every outcome kept: JOBS jobs enqueued with "keep" and drained at
#    concurrency 50 by the worker with a handler that returns 100 bytes of
#    JSON (worker/examples/bench_result.rs), beside the same jobs without
#    "keep"; jobs/s and Redis memory per kept outcome. Then BullMQ 5 with
#    its defaults (every completed job kept with its return value, the same
#    100 bytes) at concurrency 50 on the same Redis.
# 3. WAITERS waits (one connection each) on jobs that do not end, for
#    WAIT_SECONDS: the share of a core Redis spends on them
#    (queue/examples/waiters.rs).
#
#   scripts/bench-outcomes.sh
#   BASE=65e71ff ROUNDS=3 JOBS=20000 WAITERS=1000 WAIT_SECONDS=30 scripts/bench-outcomes.sh
#   SKIP_AB=1 scripts/bench-outcomes.sh     # parts 2 and 3 only
#
# Builds in release: this tree into target/, BASE into target/bench-base
# (a worktree and a target folder of its own). Needs what scripts/bench.sh
# and scripts/bench-others.sh need (redis-server, redis-cli,
# redis-benchmark, /usr/bin/time, node and npm).
set -euo pipefail
cd "$(dirname "$0")/.."

BASE=${BASE:-65e71ff}
ROUNDS=${ROUNDS:-3}
JOBS=${JOBS:-20000}
WAITERS=${WAITERS:-1000}
WAIT_SECONDS=${WAIT_SECONDS:-30}
TARGET=${CARGO_TARGET_DIR:-target}

for tool in redis-server redis-cli node npm /usr/bin/time; do
  command -v "$tool" >/dev/null || { echo "$tool not found" >&2; exit 1; }
done

cargo build --quiet --release -p workerpool-worker -p workerpool-cli --bins \
  --example bench --example floor --example bench_result
cargo build --quiet --release -p workerpool-queue --example waiters
CLI=$TARGET/release/workerpool
RESULT_WORKER=$TARGET/release/examples/bench_result
WAITING=$TARGET/release/examples/waiters

steady() {
  # The steady jobs/s column of scripts/bench.sh, per concurrency: "C RATE".
  awk 'NR > 1 { print $1, $3 }'
}

if [ -z "${SKIP_AB:-}" ]; then
  base=target/bench-base
  if [ ! -x "$base/bin/workerpool-worker" ]; then
    rm -rf "$base/src"
    git worktree add --force --detach "$base/src" "$BASE" >/dev/null
    (cd "$base/src" && CARGO_TARGET_DIR=../target cargo build --quiet --release \
      -p workerpool-worker -p workerpool-cli --bins --example bench --example floor)
    mkdir -p "$base/bin"
    for b in workerpool-worker workerpool; do cp "$base/target/release/$b" "$base/bin/"; done
    for b in bench floor; do cp "$base/target/release/examples/$b" "$base/bin/"; done
    git worktree remove --force "$base/src"
  fi
  echo "1. nothing kept: steady jobs/s, $BASE (base) against this build, $ROUNDS rounds"
  printf '%-6s %-11s %10s %10s %7s\n' round concurrency base new new/base
  for ((r = 1; r <= ROUNDS; r++)); do
    old=$(BIN_DIR=$base/bin JOBS=$JOBS CONCURRENCY="10 50" scripts/bench.sh | steady)
    new=$(JOBS=$JOBS CONCURRENCY="10 50" scripts/bench.sh | steady)
    paste <(echo "$old") <(echo "$new") | while read -r c a _ b; do
      printf '%-6s %-11s %10d %10d %7.3f\n' "$r" "$c" "$a" "$b" "$(echo "$b/$a" | bc -l)"
    done
  done
fi

tmp=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" --daemonize yes --maxclients 20000 >/dev/null
cleanup() { redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$tmp"; }
trap cleanup EXIT
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
url="redis://127.0.0.1:$port/0"
cli() { redis-cli -p "$port" "$@"; }
used_memory() { cli INFO memory | tr -d '\r' | awk -F: '/^used_memory:/ {print $2}'; }

# drain KEEP: JOBS jobs (with "keep": KEEP seconds, or none when empty)
# drained at concurrency 50 by the result worker; prints "JOBS_PER_S BYTES"
# (Redis memory after the drain, less an empty Redis's, per job).
drain() {
  local keep=$1 extra=
  [ -n "$keep" ] && extra=",\"keep\":$keep"
  cli FLUSHALL >/dev/null
  local empty
  empty=$(used_memory)
  for ((i = 0; i < JOBS; i++)); do
    echo "{\"task\":\"transcode\",\"data\":{\"src\":\"s3://in/$i.mov\"}$extra}"
  done | "$CLI" enqueue --redis-url "$url" --queue bench >/dev/null
  local start end
  start=${EPOCHREALTIME/./}
  # --handler noop: the flags must name one; the example runs its own.
  "$RESULT_WORKER" --redis-url "$url" --queue bench --concurrency 50 \
    --listen 127.0.0.1:0 --worker-id bench --handler noop 2>"$tmp/worker.log" &
  local worker=$!
  while read -r n; do
    [ "${n:-0}" = "$JOBS" ] && break
    kill -0 "$worker" 2>/dev/null || { cat "$tmp/worker.log" >&2; exit 1; }
  done < <(cli -r -1 -i 0.002 GET bench:stats:processed)
  end=${EPOCHREALTIME/./}
  kill -TERM "$worker"
  wait "$worker" || true
  local after
  after=$(used_memory)
  echo "$(( JOBS * 1000000 / (end - start) )) $(( (after - empty) / JOBS ))"
}

echo
echo "2. every outcome kept: $JOBS jobs at concurrency 50, a 100-byte result each"
printf '%-34s %9s %16s\n' runtime "jobs/s" "Redis bytes/job"
read -r rate bytes < <(drain "")
printf '%-34s %9d %16d\n' "workerpool, nothing kept" "$rate" "$bytes"
read -r rate bytes < <(drain 86400)
printf '%-34s %9d %16d\n' "workerpool, keep 1 day" "$rate" "$bytes"
others=target/bench-others
mkdir -p "$others"
[ -d "$others/node_modules/bullmq" ] || (cd "$others" && npm install --silent bullmq@5 >/dev/null)
cp scripts/bench-others/bullmq.js "$others/"
cli FLUSHALL >/dev/null
empty=$(used_memory)
line=$(cd "$others" && node bullmq.js "$port" "$JOBS" 50 keep)
after=$(used_memory)
printf '%-34s %9d %16d\n' "BullMQ 5, defaults (keeps all)" "${line##* }" $(( (after - empty) / JOBS ))

echo
echo "3. $WAITERS waits on jobs that do not end, for $WAIT_SECONDS s"
cli FLUSHALL >/dev/null
"$WAITING" "$url" "$WAITERS" "$WAIT_SECONDS"
