#!/usr/bin/env bash
# Worker benchmark: one workerpool-worker process (release build, noop
# handler) drains JOBS preloaded jobs at each concurrency, right after the
# naive reliable-fetch floor (worker/examples/floor.rs: BLMOVE + LREM per
# job on FLOOR_CONNECTIONS connections, nothing else) drained the same jobs;
# then the pick-up latency of an idle worker is sampled, then
# redis-benchmark runs the same Redis work on the same server for the
# ceiling. CPU per job is given for the worker and for Redis (INFO cpu).
# See docs/benchmarks.md.
#
#   scripts/bench.sh                       # 20,000 jobs at concurrency 1, 10, 50
#   JOBS=5000 CONCURRENCY="1 8" scripts/bench.sh
#   HANDLER=exec scripts/bench.sh          # a no-op Python exec handler instead
#   BIN_DIR=/tmp/old scripts/bench.sh      # binaries built before (A/B)
#   TRACING=on scripts/bench.sh            # a span per attempt, exported to a local OTLP sink
#
# Uses CARGO_TARGET_DIR when set. Needs redis-server, redis-cli,
# redis-benchmark and GNU time (/usr/bin/time; apt-get install -y time).
set -euo pipefail
cd "$(dirname "$0")/.."

JOBS=${JOBS:-20000}
CONCURRENCY=${CONCURRENCY:-"1 10 50"}
SAMPLES=${SAMPLES:-2000}
FLOOR_CONNECTIONS=${FLOOR_CONNECTIONS:-10}
# noop (built in) or exec: a three-line Python handler speaking JSON lines,
# one child process per slot.
HANDLER=${HANDLER:-noop}
# on: every job carries a traceparent and the worker exports its spans
# (OTLP over HTTP) to a sink on this machine that reads and drops them.
TRACING=${TRACING:-off}
QUEUE=bench
TARGET=${CARGO_TARGET_DIR:-target}

for tool in redis-server redis-cli redis-benchmark /usr/bin/time; do
  command -v "$tool" >/dev/null || { echo "$tool not found" >&2; exit 1; }
done
# BIN_DIR: binaries built before (workerpool-worker, workerpool, bench and
# floor in one folder), to compare two builds on one machine.
if [ -n "${BIN_DIR:-}" ]; then
  WORKER=$BIN_DIR/workerpool-worker CLI=$BIN_DIR/workerpool
  LATENCY=$BIN_DIR/bench FLOOR=$BIN_DIR/floor
else
  cargo build --quiet --release -p workerpool-worker -p workerpool-cli --bins --example bench --example floor
  WORKER=$TARGET/release/workerpool-worker CLI=$TARGET/release/workerpool
  LATENCY=$TARGET/release/examples/bench FLOOR=$TARGET/release/examples/floor
fi

tmp=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" --daemonize no >"$tmp/redis.log" 2>&1 &
redis_pid=$!
time_pid=
cleanup() {
  if [ -n "$time_pid" ]; then kill "$time_pid" 2>/dev/null || true; fi
  kill "$redis_pid" 2>/dev/null || true
  if [ -n "${sink_pid:-}" ]; then kill "$sink_pid" 2>/dev/null || true; fi
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
url="redis://127.0.0.1:$port/0"
cli() { redis-cli -p "$port" "$@"; }
until cli ping >/dev/null 2>&1; do sleep 0.05; done
# Redis's CPU seconds so far (user + system).
redis_cpu() { cli INFO cpu | tr -d '\r' | awk -F: '/^used_cpu_(user|sys):/ {s += $2} END {printf "%.6f", s}'; }

# A realistic job: producer fields plus what the worker stamps.
job='{"task":"noop","data":{"user":12345,"template":"welcome","locale":"en"}}'
stamped='{"attempt":1,"id":"6b1f0c2e9a4d4f0e8c3b2a1d0e9f8a7b","enqueued_at":1767225600000,"task":"noop","data":{"user":12345,"template":"welcome","locale":"en"}}'
# The Redis work of one job in one script: the producer's LPUSH, the fetch
# (RPOP, and LPUSH of the stamped payload into the processing list) and the
# ack (LREM + INCR). The worker spends one or two round trips on the same
# commands (fewer per job when it batches).
per_job="redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('RPOP', KEYS[1])
redis.call('LPUSH', KEYS[2], ARGV[2])
redis.call('LREM', KEYS[2], 1, ARGV[2])
return redis.call('INCR', KEYS[3])"

case $TRACING in
  off) ;;
  on)
    job='{"task":"noop","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","data":{"user":12345,"template":"welcome","locale":"en"}}'
    sink_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    python3 - "$sink_port" <<'PY' &
import http.server, sys
class Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
PY
    sink_pid=$!
    export OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$sink_port"
    ;;
  *) echo "TRACING is on or off, not $TRACING" >&2; exit 1 ;;
esac

for ((i = 0; i < JOBS; i++)); do echo "$job"; done >"$tmp/jobs"

case $HANDLER in
  noop) handler=(--handler noop) ;;
  exec)
    cat >"$tmp/handler.py" <<'PY'
import sys
for line in sys.stdin:
    sys.stdout.write('{"ok":true}\n'); sys.stdout.flush()
PY
    # The interpreter itself, not a wrapper script that finds it (pyenv's
    # shim costs 150 ms per child).
    python=$(python3 -c 'import sys; print(sys.executable)')
    handler=(-- "$python" "$tmp/handler.py") ;;
  *) echo "HANDLER is noop or exec, not $HANDLER" >&2; exit 1 ;;
esac

printf '%-11s %9s %9s %9s %7s %8s %8s %10s %10s %9s %9s %9s %7s\n' \
  concurrency "jobs/s" "steady/s" "floor/s" "×floor" "p50 ms" "p99 ms" "worker µs" "redis µs" "peak RSS" "idle RSS" "ceiling" "×ceil"
for c in $CONCURRENCY; do
  cli FLUSHALL >/dev/null
  "$CLI" enqueue --redis-url "$url" --queue "$QUEUE" <"$tmp/jobs" >/dev/null
  floor_json=$("$FLOOR" "$url" "$QUEUE" "$JOBS" "$FLOOR_CONNECTIONS")
  # shellcheck disable=SC2001
  floor=$(echo "$floor_json" | sed 's/.*"jobs_per_s":\([0-9]*\).*/\1/')
  cli FLUSHALL >/dev/null
  "$CLI" enqueue --redis-url "$url" --queue "$QUEUE" <"$tmp/jobs" >/dev/null
  redis_before=$(redis_cpu)
  start=${EPOCHREALTIME/./}
  /usr/bin/time -f '%U %S %M' -o "$tmp/time" \
    "$WORKER" --redis-url "$url" --queue "$QUEUE" --concurrency "$c" \
      --listen 127.0.0.1:0 --worker-id bench "${handler[@]}" 2>"$tmp/worker.log" &
  time_pid=$!
  # The steady rate leaves out the start: from the tenth job in ten done
  # (the exec handler's children start with the worker). One redis-cli
  # polls every 2 ms and bash reads its lines: a process started per poll
  # would take a good part of a core from the worker and Redis.
  tenth=
  while read -r done_now; do
    done_now=${done_now:-0}
    if [ -z "$tenth" ] && [ "$done_now" -ge $((JOBS / 10)) ]; then tenth=${EPOCHREALTIME/./}; fi
    [ "$done_now" = "$JOBS" ] && break
  done < <(cli -r -1 -i 0.002 GET "$QUEUE:stats:processed")
  end=${EPOCHREALTIME/./}
  redis_after=$(redis_cpu)
  worker_pid=$(pgrep -P "$time_pid")
  sleep 0.5
  idle_kb=$(awk '/VmRSS/ {print $2}' "/proc/$worker_pid/status")
  kill -TERM "$worker_pid"
  wait "$time_pid"
  time_pid=
  read -r user sys peak_kb <"$tmp/time"
  if [ "$TRACING" = on ] && grep -q "export failed\|spans not sent" "$tmp/worker.log"; then
    echo "bench: some spans were not exported at concurrency $c (see the worker's log)" >&2
  fi
  rate=$(( JOBS * 1000000 / (end - start) ))
  steady=$(( (JOBS - JOBS / 10) * 1000000 / (end - tenth) ))

  latency=$("$LATENCY" "$url" "$c" "$SAMPLES" 2>/dev/null)
  # shellcheck disable=SC2001 # a capture group: ${latency//…} has none
  p50=$(echo "$latency" | sed 's/.*"p50_us":\([0-9]*\).*/\1/')
  # shellcheck disable=SC2001
  p99=$(echo "$latency" | sed 's/.*"p99_us":\([0-9]*\).*/\1/')

  cli FLUSHALL >/dev/null
  ceiling=$(redis-benchmark -p "$port" -n "$JOBS" -c "$c" -P 1 -q \
    EVAL "$per_job" 3 "$QUEUE" "$QUEUE:processing:x" "$QUEUE:stats:processed" "$job" "$stamped" \
    | tr '\r' '\n' | sed -n 's/.*: \([0-9.]*\) requests per second.*/\1/p' | tail -n 1 | cut -d. -f1)
  printf '%-11s %9d %9d %9d %7.2f %8.2f %8.2f %10.1f %10.1f %7dMB %8dMB %9d %6.0f%%\n' \
    "$c" "$rate" "$steady" "$floor" "$(echo "$rate/$floor" | bc -l)" \
    "$(echo "$p50/1000" | bc -l)" "$(echo "$p99/1000" | bc -l)" \
    "$(echo "1000000*($user+$sys)/$JOBS" | bc -l)" \
    "$(echo "1000000*($redis_after-$redis_before)/$JOBS" | bc -l)" \
    $((peak_kb / 1024)) $((idle_kb / 1024)) \
    "$ceiling" "$(echo "100*$rate/$ceiling" | bc -l)"
done
