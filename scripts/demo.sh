#!/usr/bin/env bash
# Demo: a throwaway redis-server, a burst of jobs, one worker process
# draining them through the exec handler, then a summary.
set -euo pipefail
cd "$(dirname "$0")/.."

JOBS=${JOBS:-2000}
CONCURRENCY=${CONCURRENCY:-50}
QUEUE=demo

command -v redis-server >/dev/null || { echo "redis-server not found: apt-get install -y redis-server" >&2; exit 1; }
cargo build --quiet -p workerpool-worker
WORKER=target/debug/workerpool-worker

tmp=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null || echo 16379)
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" --daemonize no >"$tmp/redis.log" 2>&1 &
redis_pid=$!
worker_pid=
cleanup() {
  [ -n "$worker_pid" ] && kill "$worker_pid" 2>/dev/null || true
  kill "$redis_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
cli() { redis-cli -p "$port" "$@"; }
until cli ping >/dev/null 2>&1; do sleep 0.05; done

echo "redis-server on 127.0.0.1:$port; pushing $JOBS jobs (about 100 ms each, 1 in 100 fails once, 1 malformed)"
args=()
for i in $(seq 1 "$JOBS"); do
  if [ $((i % 100)) -eq 0 ]; then
    args+=("{\"task\":\"resize\",\"data\":{\"n\":$i,\"flaky\":true}}")
  else
    args+=("{\"task\":\"resize\",\"data\":{\"n\":$i}}")
  fi
done
cli LPUSH "$QUEUE" "${args[@]}" >/dev/null
cli LPUSH "$QUEUE" "this is not JSON" >/dev/null

# A handler in plain sh: sleeps 100 ms per job; a flaky job fails its
# first attempt and succeeds on the retry.
handler='while read -r job; do
  sleep 0.1
  case "$job" in
    *"\"flaky\":true"*"\"attempt\":1"*|*"\"attempt\":1"*"\"flaky\":true"*) echo "{\"ok\":false,\"error\":\"flaky upstream\"}" ;;
    *) echo "{\"ok\":true}" ;;
  esac
done'

start=$(date +%s.%N)
RUST_LOG=${RUST_LOG:-warn} "$WORKER" --redis-url "redis://127.0.0.1:$port" --queue "$QUEUE" \
  --concurrency "$CONCURRENCY" --backoff-base 200ms --backoff-max 1s --listen 127.0.0.1:0 \
  -- sh -c "$handler" &
worker_pid=$!

total=$((JOBS + 1))
while :; do
  done_=$(cli GET "$QUEUE:stats:processed"); done_=${done_:-0}
  dead=$(cli LLEN "$QUEUE:dead")
  waiting=$(cli LLEN "$QUEUE")
  retry=$(cli ZCARD "$QUEUE:retry")
  printf '\r  waiting %6s  retrying %4s  done %6s  dead %3s' "$waiting" "$retry" "$done_" "$dead"
  [ $((done_ + dead)) -ge "$total" ] && break
  sleep 0.5
done
end=$(date +%s.%N)
echo
kill -TERM "$worker_pid"; wait "$worker_pid" || true; worker_pid=

echo "dead letter: $(cli LINDEX "$QUEUE:dead" 0)"
awk -v s="$start" -v e="$end" -v n="$done_" -v c="$CONCURRENCY" \
  'BEGIN { t = e - s; printf "done %d jobs in %.1f s with one worker at concurrency %d: %.0f jobs/s\n", n, t, c, n / t }'
