#!/usr/bin/env bash
# The handler model's figures: one exec child holding many jobs
# (--children below --concurrency) against one child per job. Each
# scenario drains jobs preloaded on a queue of its own on one throwaway
# redis-server; see docs/benchmarks.md, "One process, many jobs".
#
#   1. Python async I/O: an App task `async def io(data): await
#      asyncio.sleep(0.2)`, JOBS_IO jobs at --concurrency 50, with
#      --children 1 and with the default (50 children): jobs/s, and the
#      memory of the worker's whole process tree while busy; then the PSS
#      of one idle child of the same handler and the ratio of the two;
#   2. Node async I/O: the same with the Node App and a 200 ms timer;
#   3. no-op exec throughput at --concurrency 50 (a stdlib Python handler
#      answering each line at once): 50 children, 1 child, 2 children, and
#      50 children with the worker of BIN_DIR_OLD when set;
#   4. CPU-bound Python (a busy loop until the thread has had 50 ms of
#      CPU), JOBS_CPU jobs at --concurrency 2: two children against one
#      child's two threads, which share the GIL.
#
#   scripts/bench-handlers.sh
#   QUICK=1 scripts/bench-handlers.sh                  # small counts, a smoke run
#   JOBS_IO=6000 JOBS_NOOP=50000 JOBS_CPU=800 scripts/bench-handlers.sh
#   SCENARIOS="py-io noop" scripts/bench-handlers.sh   # some of py-io node-io noop cpu
#   BIN_DIR=/tmp/new BIN_DIR_OLD=/tmp/old scripts/bench-handlers.sh
#
# BIN_DIR names a folder with workerpool-worker and workerpool built
# before; without it the release binaries are built (CARGO_TARGET_DIR is
# honoured). The Python venv and the Node client's dependencies come from
# scripts/sdk-env-python.sh and scripts/sdk-env-node.sh. Needs
# redis-server, redis-cli, Node.js 20 or newer (node-io) and Linux /proc
# (smaps_rollup).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

if [ -n "${QUICK:-}" ]; then
  quick_io=300 quick_noop=2000 quick_cpu=40
else
  quick_io=3000 quick_noop=20000 quick_cpu=400
fi
JOBS_IO=${JOBS_IO:-$quick_io}
JOBS_NOOP=${JOBS_NOOP:-$quick_noop}
JOBS_CPU=${JOBS_CPU:-$quick_cpu}
SCENARIOS=${SCENARIOS:-"py-io node-io noop cpu"}
# Seconds a scenario may take before the script gives up on it.
TIMEOUT=${TIMEOUT:-600}
# Seconds an idle child is given for its imports before its PSS is read.
IDLE_WAIT=${IDLE_WAIT:-2}
TARGET=${CARGO_TARGET_DIR:-target}

wants() { [[ " $SCENARIOS " == *" $1 "* ]]; }

for tool in redis-server redis-cli awk; do
  command -v "$tool" >/dev/null || { echo "$tool not found" >&2; exit 1; }
done
if wants node-io && ! command -v node >/dev/null; then
  echo "node not found (needed by node-io; leave it out of SCENARIOS)" >&2
  exit 1
fi
if [ -n "${BIN_DIR:-}" ]; then
  WORKER=$BIN_DIR/workerpool-worker CLI=$BIN_DIR/workerpool
  build="binaries of $BIN_DIR"
else
  cargo build --quiet --release -p workerpool-worker -p workerpool-cli --bins
  WORKER=$TARGET/release/workerpool-worker CLI=$TARGET/release/workerpool
  build="release build"
fi
OLD_WORKER=
if [ -n "${BIN_DIR_OLD:-}" ]; then
  OLD_WORKER=$BIN_DIR_OLD/workerpool-worker
  [ -x "$OLD_WORKER" ] || { echo "$OLD_WORKER is not an executable" >&2; exit 1; }
fi

python=$(scripts/sdk-env-python.sh)
if wants node-io; then scripts/sdk-env-node.sh; fi
# The Python client from this tree (the venv holds its dependencies).
export PYTHONPATH="$root/sdk/python/src${PYTHONPATH:+:$PYTHONPATH}"

tmp=$(mktemp -d)
port=$("$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" --daemonize no >"$tmp/redis.log" 2>&1 &
redis_pid=$!
worker_pid=
cleanup() {
  if [ -n "$worker_pid" ]; then kill "$worker_pid" 2>/dev/null || true; fi
  kill "$redis_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
url="redis://127.0.0.1:$port/0"
cli() { redis-cli -p "$port" "$@"; }
until cli ping >/dev/null 2>&1; do sleep 0.05; done

# The handlers.
cat >"$tmp/py_io.py" <<'PY'
import asyncio

from workerpool_client import App

app = App()


@app.task("io")
async def io(data):
    await asyncio.sleep(0.2)


app.run()
PY
cat >"$tmp/node_io.mjs" <<JS
import { App } from '$root/sdk/node/index.mjs';

const app = new App();
app.task('io', () => new Promise((resolve) => setTimeout(resolve, 200)));
await app.run();
JS
# No-op, the standard library only: with a share of one, one answer per
# line in turn; above one, each line answered at once with its job's id
# (a cancel line needs nothing: its job was answered already).
cat >"$tmp/noop.py" <<'PY'
import json, os, sys
if int(os.environ.get("WORKERPOOL_JOBS_PER_CHILD", "1")) > 1:
    for line in sys.stdin:
        job = json.loads(line)
        if "id" in job:
            sys.stdout.write('{"id":%s,"ok":true}\n' % json.dumps(job["id"])); sys.stdout.flush()
else:
    for line in sys.stdin:
        sys.stdout.write('{"ok":true}\n'); sys.stdout.flush()
PY
cat >"$tmp/py_cpu.py" <<'PY'
import time

from workerpool_client import App

app = App()


@app.task("spin")
def spin(data):
    # 50 ms of this thread's CPU time: a wall clock would let two threads
    # sharing the GIL each count the other's turns as its own.
    t = time.thread_time()
    while time.thread_time() - t < 0.05:
        pass


app.run()
PY
node_bin=$(command -v node || true)
node_version=$(node --version 2>/dev/null || echo none)

# make_jobs TASK COUNT: a file of COUNT job lines for TASK.
make_jobs() {
  local f=$tmp/jobs-$1-$2 i
  for ((i = 0; i < $2; i++)); do echo "{\"task\":\"$1\",\"data\":{}}"; done >"$f"
  echo "$f"
}

# tree_mem PID: the memory of PID and every process below it, read from
# /proc/*/stat (parents) and /proc/*/smaps_rollup: "PSS_kB RSS_kB
# worker_PSS_kB processes", the worker's PSS being that of PID and of its
# keeper (`workerpool-worker __workerpool-handler-keeper`, a child of the
# worker), which the sums count too.
tree_mem() {
  local stat line rest pid ppid keeper=
  local -A kids=()
  for stat in /proc/[0-9]*/stat; do
    read -r line 2>/dev/null <"$stat" || continue
    pid=${stat#/proc/} pid=${pid%/stat}
    rest=${line##*) }
    ppid=${rest#* } ppid=${ppid%% *}
    kids[$ppid]+=" $pid"
  done
  local -a todo=("$1") files=() args=()
  while [ ${#todo[@]} -gt 0 ]; do
    pid=${todo[0]} todo=("${todo[@]:1}")
    files+=("/proc/$pid/smaps_rollup")
    mapfile -d '' -t args 2>/dev/null <"/proc/$pid/cmdline" || args=()
    if [ "${args[1]:-}" = __workerpool-handler-keeper ]; then keeper=/proc/$pid/smaps_rollup; fi
    # shellcheck disable=SC2206 # the list of pids is split on purpose
    todo+=(${kids[$pid]:-})
  done
  awk -v worker="/proc/$1/smaps_rollup" -v keeper="$keeper" -v n=${#files[@]} '
    /^Rss:/ { r += $2 }
    /^Pss:/ { p += $2; if (FILENAME == worker || FILENAME == keeper) k += $2 }
    END { print p + 0, r + 0, k + 0, n }' "${files[@]}" 2>/dev/null || true
}

# run LABEL QUEUE JOBS_FILE SAMPLE WORKER ARGS...: preloads the jobs on
# QUEUE, starts WORKER with ARGS and measures until every job is done (or
# dead-lettered). Sets rate (from the worker's start), steady (from the
# tenth job in ten), failed, and with SAMPLE=1 the largest of three
# samples of the process tree's memory taken at 30, 50 and 70 % done:
# pss, rss (kB), kpss (the worker's and its keeper's PSS), procs.
run() {
  local label=$1 queue=$2 jobs_file=$3 sample=$4 worker=$5 n start tenth='' end
  local next_sample deadline polls=0 p d done_now sp sr sk sn
  shift 5
  n=$(wc -l <"$jobs_file")
  "$CLI" enqueue --redis-url "$url" --queue "$queue" <"$jobs_file" >/dev/null
  pss=0 rss=0 kpss=0 procs=0
  local -a marks=($((n * 3 / 10)) $((n / 2)) $((n * 7 / 10)))
  next_sample=0
  start=${EPOCHREALTIME/./}
  deadline=$((start + TIMEOUT * 1000000))
  "$worker" --redis-url "$url" --queue "$queue" --listen 127.0.0.1:0 \
    --worker-id "bench-$queue" "$@" 2>"$tmp/$queue.log" &
  worker_pid=$!
  # One redis-cli polls every 5 ms and bash reads its lines (two a poll:
  # done and dead-lettered).
  while read -r p && read -r d; do
    done_now=$(( ${p:-0} + ${d:-0} ))
    if [ -z "$tenth" ] && [ "$done_now" -ge $((n / 10)) ]; then tenth=${EPOCHREALTIME/./}; fi
    [ "$done_now" -ge "$n" ] && break
    if [ "$sample" = 1 ] && [ "$next_sample" -lt 3 ] && [ "$done_now" -ge "${marks[$next_sample]}" ]; then
      next_sample=$((next_sample + 1))
      read -r sp sr sk sn < <(tree_mem "$worker_pid")
      if [ "${sp:-0}" -gt "$pss" ]; then pss=$sp rss=$sr kpss=$sk procs=$sn; fi
    fi
    polls=$((polls + 1))
    if [ $((polls % 100)) = 0 ]; then
      if ! kill -0 "$worker_pid" 2>/dev/null; then
        echo "$label: the worker exited with $done_now of $n jobs done; its log:" >&2
        tail -n 20 "$tmp/$queue.log" >&2
        exit 1
      fi
      if [ "${EPOCHREALTIME/./}" -gt "$deadline" ]; then
        echo "$label: $done_now of $n jobs done after ${TIMEOUT} s (TIMEOUT); the worker's log:" >&2
        tail -n 20 "$tmp/$queue.log" >&2
        exit 1
      fi
    fi
  done < <(cli -r -1 -i 0.005 MGET "$queue:stats:processed" "$queue:stats:dead")
  end=${EPOCHREALTIME/./}
  kill -TERM "$worker_pid"
  wait "$worker_pid" || true
  worker_pid=
  failed=$(cli GET "$queue:stats:failed")
  failed=${failed:-0}
  rate=$((n * 1000000 / (end - start)))
  steady=$(((n - n / 10) * 1000000 / (end > tenth ? end - tenth : 1)))
}

mb() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else printf "-" }'; }

# row LABEL N: one line of the table from run's results.
row() {
  if [ "$pss" -gt 0 ]; then
    printf '%-38s %6d %8d %9d %8s %8s %8s %6d %7d\n' "$1" "$2" "$rate" "$steady" \
      "$(mb "$pss")" "$(mb "$kpss")" "$(mb "$rss")" "$procs" "$failed"
  else
    printf '%-38s %6d %8d %9d %8s %8s %8s %6s %7d\n' "$1" "$2" "$rate" "$steady" - - - - "$failed"
  fi
}

# idle_pss COMMAND...: sets idle to the PSS (kB) of COMMAND started alone
# with a share of one and its stdin open, IDLE_WAIT seconds after its start.
idle_pss() {
  local fifo=$tmp/idle.fifo pid
  rm -f "$fifo"
  mkfifo "$fifo"
  WORKERPOOL_JOBS_PER_CHILD=1 "$@" <"$fifo" >/dev/null 2>>"$tmp/idle.log" &
  pid=$!
  exec 3>"$fifo"
  sleep "$IDLE_WAIT"
  idle=$(awk '/^Pss:/ { print $2 }' "/proc/$pid/smaps_rollup")
  exec 3>&-
  wait "$pid" || true
}

cores=$(nproc)
echo "workerpool $(git describe --always --dirty --tags 2>/dev/null || echo unknown), $build"
echo "$cores cores, $(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null || echo 'cpu unknown')"
echo "$("$python" --version 2>&1), node $node_version, $(redis-server --version | awk '{ print $1, $3 }')"
echo "jobs: io $JOBS_IO, noop $JOBS_NOOP, cpu $JOBS_CPU"
echo
printf '%-38s %6s %8s %9s %8s %8s %8s %6s %7s\n' \
  scenario jobs "jobs/s" "steady/s" "PSS MB" "worker" "RSS MB" procs failed

summary=()
if wants py-io; then
  f=$(make_jobs io "$JOBS_IO")
  run "python io, 50 in 1 child" py-io-1 "$f" 1 "$WORKER" --concurrency 50 --children 1 -- "$python" "$tmp/py_io.py"
  row "python io c50, children 1" "$JOBS_IO"
  one_pss=$pss one_rate=$rate
  run "python io, 50 children" py-io-50 "$f" 1 "$WORKER" --concurrency 50 -- "$python" "$tmp/py_io.py"
  row "python io c50, children 50 (default)" "$JOBS_IO"
  idle_pss "$python" "$tmp/py_io.py"
  summary+=("python: one idle App child (share 1) PSS $(mb "$idle") MB; children 1: whole worker PSS / idle child = $(ratio "$one_pss" "$idle") (target <= 2), $one_rate jobs/s (target >= 240); children 50: $(ratio "$pss" "$idle") idle children's worth")
fi
if wants node-io; then
  f=$(make_jobs io "$JOBS_IO")
  run "node io, 50 in 1 child" node-io-1 "$f" 1 "$WORKER" --concurrency 50 --children 1 -- "$node_bin" "$tmp/node_io.mjs"
  row "node io c50, children 1" "$JOBS_IO"
  one_pss=$pss one_rate=$rate
  run "node io, 50 children" node-io-50 "$f" 1 "$WORKER" --concurrency 50 -- "$node_bin" "$tmp/node_io.mjs"
  row "node io c50, children 50 (default)" "$JOBS_IO"
  idle_pss "$node_bin" "$tmp/node_io.mjs"
  summary+=("node: one idle App child (share 1) PSS $(mb "$idle") MB; children 1: whole worker PSS / idle child = $(ratio "$one_pss" "$idle"), $one_rate jobs/s; children 50: $(ratio "$pss" "$idle") idle children's worth")
fi
if wants noop; then
  f=$(make_jobs noop "$JOBS_NOOP")
  run "noop, 50 children" noop-50 "$f" 0 "$WORKER" --concurrency 50 -- "$python" "$tmp/noop.py"
  row "noop c50, children 50 (default)" "$JOBS_NOOP"
  new_rate=$rate
  if [ -n "$OLD_WORKER" ]; then
    run "noop, 50 children, old worker" noop-50-old "$f" 0 "$OLD_WORKER" --concurrency 50 -- "$python" "$tmp/noop.py"
    row "noop c50, children 50, BIN_DIR_OLD" "$JOBS_NOOP"
    summary+=("noop c50, 50 children: this worker / BIN_DIR_OLD's = $(ratio "$new_rate" "$rate") (jobs/s)")
  fi
  run "noop, 50 in 1 child" noop-1 "$f" 0 "$WORKER" --concurrency 50 --children 1 -- "$python" "$tmp/noop.py"
  row "noop c50, children 1" "$JOBS_NOOP"
  run "noop, 50 in 2 children" noop-2 "$f" 0 "$WORKER" --concurrency 50 --children 2 -- "$python" "$tmp/noop.py"
  row "noop c50, children 2" "$JOBS_NOOP"
fi
if wants cpu; then
  f=$(make_jobs spin "$JOBS_CPU")
  run "cpu, 2 children" cpu-2 "$f" 0 "$WORKER" --concurrency 2 -- "$python" "$tmp/py_cpu.py"
  row "python cpu c2, children 2 (default)" "$JOBS_CPU"
  run "cpu, 2 threads in 1 child" cpu-1 "$f" 0 "$WORKER" --concurrency 2 --children 1 -- "$python" "$tmp/py_cpu.py"
  row "python cpu c2, children 1 (threads)" "$JOBS_CPU"
  summary+=("cpu: 50 ms jobs at --concurrency 2 on $cores cores: the ideal is $(( (cores < 2 ? cores : 2) * 20 )) jobs/s")
fi

echo
echo "PSS, worker and RSS: the largest of three samples at 30/50/70 % done of the worker's"
echo "whole process tree (worker, its keeper process and the handler children); \"worker\""
echo "is the PSS of the worker and its keeper alone. procs counts the tree."
for line in "${summary[@]}"; do echo "$line"; done
