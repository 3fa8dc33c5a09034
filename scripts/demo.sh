#!/usr/bin/env bash
# Demo: local mode runs manifests/examples/demo.yaml (0 to 8 workers, about
# 100 ms per job) against a throwaway redis-server. A burst of jobs wakes the
# pool from zero; it scales up, drains the queue, scales back to zero, and
# local mode prints the summary. Everything started here is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

JOBS=${JOBS:-3000}
MANIFEST=manifests/examples/demo.yaml
QUEUE=demo

for tool in redis-server redis-cli; do
  command -v "$tool" >/dev/null || { echo "$tool not found: apt-get install -y redis-server" >&2; exit 1; }
done
# The first build takes minutes: say so, and let cargo show its progress
# (on a terminal, its progress bar; one "Finished" line once built).
echo "building the workerpool binaries (debug; the first time takes a few minutes)..."
cargo build --workspace --bins
target=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
BIN=${target:-target}/debug

free_port() {
  local port
  while :; do
    port=$((20000 + RANDOM % 40000))
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || { echo "$port"; return; }
  done
}

tmp=$(mktemp -d)
port=$(free_port)
redis_pid='' local_pid=''
cleanup() {
  [ -n "$local_pid" ] && kill -TERM "$local_pid" 2>/dev/null && wait "$local_pid" 2>/dev/null
  [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" \
  --daemonize no >"$tmp/redis.log" 2>&1 &
redis_pid=$!
cli() { redis-cli -p "$port" "$@"; }
for _ in $(seq 100); do cli ping >/dev/null 2>&1 && break; sleep 0.05; done
cli ping >/dev/null

echo "redis-server on 127.0.0.1:$port; local mode on $MANIFEST; $JOBS jobs arrive in two bursts"
echo
# Worker logs at warn: the table shows what matters.
RUST_LOG=${RUST_LOG:-warn} "$BIN/workerpool-operator" local -f "$MANIFEST" \
  --redis-url "redis://127.0.0.1:$port/0" --worker-bin "$BIN/workerpool-worker" &
local_pid=$!

push() {
  local args=() i
  for i in $(seq "$1" "$2"); do args+=("{\"task\":\"resize\",\"data\":{\"n\":$i}}"); done
  cli LPUSH "$QUEUE" "${args[@]}" >/dev/null
}
sleep 3                           # the pool sits at zero
first=$((JOBS / 15))
push 1 "$first"                   # a first wave wakes it at a small size
sleep 3
push $((first + 1)) "$JOBS"       # the burst scales it up to maxReplicas
cli LPUSH "$QUEUE" "this is not JSON" >/dev/null   # dead-lettered as malformed

# Wait until every job is done or dead and the pool is back at zero.
total=$((JOBS + 1)) quiet=0
for _ in $(seq 240); do
  done_=$(cli GET "$QUEUE:stats:processed"); dead=$(cli LLEN "$QUEUE:dead")
  workers=$(cli ZCARD "$QUEUE:workers")
  if [ $((${done_:-0} + dead)) -ge "$total" ] && [ "$workers" -eq 0 ]; then quiet=$((quiet + 1)); else quiet=0; fi
  [ "$quiet" -ge 4 ] && break
  sleep 0.5
done
kill -INT "$local_pid"
wait "$local_pid" || true
local_pid=
