#!/usr/bin/env bash
# Memory of large payloads: the worker's peak RSS (GNU time) with one job
# of BIG_MB (50 MB by default; over the default --max-payload-bytes of
# 16 MiB, so dead-lettered as too_large by the taking script), with one
# job just under the default limit for each handler kind (the built-in
# noop, an exec pool child and an exec-per-job process, both GNU awk
# answering each line) and once stamped by the fetch script, and, for comparison, with the 50 MB job under a
# limit raised to take it; then the peak RSS of the `workerpool` command
# line reading a dead list that holds three such entries (`dead list
# --limit 1`, `dead list`, `dead list --json`). Each worker row also shows
# its peak as a multiple of the job's size, and the job's own cost (peak
# less idle) as one. See docs/benchmarks.md.
#
#   scripts/bench-memory.sh
#   BIG_MB=100 scripts/bench-memory.sh
#   BIN_DIR=/tmp/old scripts/bench-memory.sh   # binaries built before (A/B)
#   WORKER_ONLY=1 scripts/bench-memory.sh      # the worker rows alone
#
# Uses CARGO_TARGET_DIR when set; builds the debug binaries unless BIN_DIR
# names a folder holding workerpool-worker and workerpool (with
# WORKER_ONLY, workerpool-worker alone). Needs redis-server, redis-cli,
# gawk and GNU time (/usr/bin/time).
set -euo pipefail
cd "$(dirname "$0")/.."

BIG_MB=${BIG_MB:-50}
LIMIT=$((16 * 1024 * 1024))
TARGET=${CARGO_TARGET_DIR:-target}
for tool in redis-server redis-cli gawk /usr/bin/time; do
  command -v "$tool" >/dev/null || { echo "$tool not found" >&2; exit 1; }
done
if [ -n "${BIN_DIR:-}" ]; then
  WORKER=$BIN_DIR/workerpool-worker CLI=$BIN_DIR/workerpool
elif [ -n "${WORKER_ONLY:-}" ]; then
  cargo build --quiet -p workerpool-worker --bin workerpool-worker
  WORKER=$TARGET/debug/workerpool-worker
else
  cargo build --quiet -p workerpool-worker -p workerpool-cli --bins
  WORKER=$TARGET/debug/workerpool-worker CLI=$TARGET/debug/workerpool
fi

work=$(mktemp -d)
port=$((20000 + RANDOM % 20000))
redis-server --port "$port" --save '' --appendonly no --dir "$work" \
  --proto-max-bulk-len 536870912 --client-query-buffer-limit 1gb >"$work/redis.log" 2>&1 &
redis_pid=$!
trap 'kill $redis_pid 2>/dev/null || true; rm -rf "$work"' EXIT
url=redis://127.0.0.1:$port
cli() { redis-cli -p "$port" "$@"; }
for _ in $(seq 50); do cli ping >/dev/null 2>&1 && break; sleep 0.1; done

# A JSON job of exactly $1 bytes in file $2, its id and enqueue time last.
job_file() {
  local size=$1 file=$2 id=$3
  local head='{"task":"big","data":"'
  local tail="\",\"id\":\"$id\",\"enqueued_at\":1767225600000}"
  { printf '%s' "$head"; head -c $((size - ${#head} - ${#tail})) /dev/zero | tr '\0' x; printf '%s' "$tail"; } >"$file"
}

# Idle, peak and final RSS (MB) of a worker that takes the job in file $2
# from queue $1, with the extra environment in $3, until the job is done or
# dead; $4 is the row's label, the rest the handler's arguments.
worker_rss() {
  local queue=$1 file=$2 env=$3 label=$4
  shift 4
  local port_http=$((port + 1 + RANDOM % 1000))
  local -a extra=()
  [ -n "$env" ] && extra=("$env")
  env "${extra[@]}" /usr/bin/time -v -o "$work/time.txt" "$WORKER" --redis-url "$url" --queue "$queue" \
    --listen "127.0.0.1:$port_http" "$@" 2>"$work/worker.log" &
  local time_pid=$!
  sleep 1
  local idle_kb
  idle_kb=$(awk '/VmRSS/ {print $2}' "/proc/$(pgrep -P "$time_pid")/status")
  cli -x LPUSH "$queue" <"$file" >/dev/null
  for _ in $(seq 600); do
    [ $(( $(cli GET "$queue:stats:processed" | sed 's/^$/0/') + $(cli GET "$queue:stats:dead" | sed 's/^$/0/') )) -ge 1 ] && break
    sleep 0.1
  done
  sleep 0.5
  local after_kb
  after_kb=$(awk '/VmRSS/ {print $2}' "/proc/$(pgrep -P "$time_pid")/status")
  kill -TERM "$(pgrep -P "$time_pid")"
  wait "$time_pid" || true
  local peak_kb
  peak_kb=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$work/time.txt")
  # The multiples: of the payload (bytes) for the peak, and for the peak
  # above the idle worker (what the job itself cost).
  local size
  size=$(wc -c <"$file")
  printf '%-48s %8s %8s %8s %7s %7s\n' "$label" "$((idle_kb / 1024))" "$((peak_kb / 1024))" "$((after_kb / 1024))" \
    "$(awk -v p="$peak_kb" -v s="$size" 'BEGIN { printf "%.1f", p * 1024 / s }')" \
    "$(awk -v p="$peak_kb" -v i="$idle_kb" -v s="$size" 'BEGIN { c = (p - i) * 1024 / s; printf "%.1f", c < 0 ? 0 : c }')"
}

# A handler child that reads one line per job and answers done; gawk, as
# the shell's `read` takes a long line one byte at a time.
answer='{ print "{\"ok\":true}"; fflush() }'
per_job='{ n++ } END { exit n == 1 ? 0 : 1 }'

echo "worker                                           idle MB  peak MB after MB  peak/x  cost/x"
job_file $((BIG_MB * 1000 * 1000)) "$work/big.json" big-0
worker_rss over "$work/big.json" "" \
  "${BIG_MB} MB job, default limit (too_large)" --handler noop
job_file $((LIMIT - 100)) "$work/under.json" under-0
worker_rss under "$work/under.json" "" \
  "16 MiB - 100 B job, default limit, noop" --handler noop
# With a 32-hex-digit id last, as `workerpool enqueue` and the library
# write jobs, the fetch script stamps it as it takes it; the other rows'
# jobs (a short id) are stamped by the worker, as is any payload over a
# few KiB that holds `id"` before its end.
job_file $((LIMIT - 100)) "$work/under.json" 0123456789abcdef0123456789abcdef
worker_rss under-stamped "$work/under.json" "" \
  "16 MiB - 100 B job, stamped by the script, noop" --handler noop
job_file $((LIMIT - 100)) "$work/under.json" under-1
worker_rss under-exec "$work/under.json" "" \
  "16 MiB - 100 B job, default limit, exec" -- gawk "$answer"
job_file $((LIMIT - 100)) "$work/under.json" under-2
worker_rss under-per-job "$work/under.json" "" \
  "16 MiB - 100 B job, default limit, exec-per-job" --handler exec-per-job -- gawk "$per_job"
worker_rss raised "$work/big.json" "WORKERPOOL_MAX_PAYLOAD_BYTES=536870912" \
  "${BIG_MB} MB job, limit raised to 512 MiB, noop" --handler noop

[ -n "${WORKER_ONLY:-}" ] && exit 0

# Three dead letters of BIG_MB each on queue `letters`, as the taking
# script writes them.
for i in 1 2 3; do
  job_file $((BIG_MB * 1000 * 1000)) "$work/big.json" "big-$i"
  size=$(wc -c <"$work/big.json")
  { printf '{"reason":"too_large","error":"payload of %s bytes is over the limit of %s bytes (--max-payload-bytes)","attempts":0,"died_at":1767225600000,"worker":"w~1","size":%s,"encoding":"raw","job":' \
      "$size" "$LIMIT" "$size"
    cat "$work/big.json"; printf '}'; } >"$work/letter.json"
  cli -x LPUSH letters:dead <"$work/letter.json" >/dev/null
done

cli_rss() {
  WORKERPOOL_REDIS_URL=$url /usr/bin/time -v -o "$work/time.txt" "$CLI" "$@" >"$work/out.txt" 2>/dev/null || true
  local peak_kb
  peak_kb=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$work/time.txt")
  printf '%-44s %10s %10s\n' "workerpool $*" "$((peak_kb / 1024))" "$(wc -c <"$work/out.txt")"
}
echo
echo "command line, dead list of 3 x ${BIG_MB} MB        peak MB  out bytes"
cli_rss dead list --queue letters --limit 1
cli_rss dead list --queue letters
cli_rss dead list --queue letters --json
