#!/usr/bin/env bash
# Chaos soak of the worker: a producer (1 % malformed payloads of fifteen
# kinds, raw bytes among them), several workerpool-worker processes with a
# Python exec handler, kill -9 and SIGTERM of workers and Redis restarts on
# timers; then a report of produced, done, missing, duplicate runs, dead
# letters by reason and worker RSS. Exits 1 when a job is lost.
#
#   scripts/soak.sh                                    # 10 minutes, release build
#   scripts/soak.sh --duration 2h --workers 5 --rate 1000
#   PROFILE=debug scripts/soak.sh --duration 60s --kill-min 5s --kill-max 10s --redis-restart-every 20s
#
# Every option: scripts/soak.sh --help. Uses CARGO_TARGET_DIR when set.
# Needs redis-server and python3.
set -euo pipefail
cd "$(dirname "$0")/.."

PROFILE=${PROFILE:-release}
TARGET=${CARGO_TARGET_DIR:-target}
for tool in redis-server python3; do
  command -v "$tool" >/dev/null || { echo "$tool not found" >&2; exit 1; }
done
# The whole workspace's binaries and an example (which, as tests do, brings in
# the dev-dependencies): one set of features for every crate, as `cargo test
# --workspace` builds them, so its dependencies serve (a build of one package
# unifies its features apart, and compiles many again).
if [ "$PROFILE" = release ]; then
  cargo build --quiet --release --workspace --bins --example soak
else
  cargo build --quiet --workspace --bins --example soak
  PROFILE=debug
fi
exec "$TARGET/$PROFILE/examples/soak" --worker-bin "$TARGET/$PROFILE/workerpool-worker" "$@"
