#!/usr/bin/env bash
# Operator benchmark: one workerpool-operator (release build, run outside
# the cluster, no leader election) against a real API server and one
# redis-server, with POOLS WorkerPools on that Redis (each its own queue).
# For each total in POOLS it prints: how long until every pool has its
# Deployment, the operator's RSS and CPU over STEADY seconds of steady state
# (and the API server's CPU then),
# how often each pool's queue was read (snapshot scripts per pool per
# poll interval: 1.00 means every pool every pollIntervalSeconds), and the
# time from a backlog appearing on one pool's queue to that pool's scale-up.
# Creating pools is bound by the API server (about 5 a second on 2 cores
# while the operator reconciles the new ones): 5,000 take about 20 minutes.
# See docs/benchmarks.md.
#
#   K8S_KIT=DIR scripts/bench-operator.sh             # 1,000 then 5,000 pools
#   K8S_KIT=DIR POOLS="100 500" STEADY=30 scripts/bench-operator.sh
#
# K8S_KIT (default: WORKERPOOL_E2E_K8S) is the cluster kit's directory, as
# for the end-to-end suite; a control plane without a node is enough
# (NODE=0: Deployments are created, no Pod runs), started with its up.sh in a
# state directory and on ports of its own and stopped with its
# lib/control-plane-down.sh, so it can run beside another cluster of the
# kit. KUBECTL (default the kit's K8S_BIN/kubectl, else
# kubectl on PATH). Uses CARGO_TARGET_DIR when set; OPERATOR=BINARY runs
# that build instead (to compare two). With PERF_DATA=FILE,
# `perf record` samples the operator (with call graphs) through each steady
# window, into FILE.N for N pools: `perf report -i FILE.1000` reads it.
set -euo pipefail
cd "$(dirname "$0")/.."

POOLS=${POOLS:-"1000 5000"}
STEADY=${STEADY:-60}
POLL=${POLL:-5}
KIT=${K8S_KIT:-${WORKERPOOL_E2E_K8S:-}}
TARGET=${CARGO_TARGET_DIR:-target}
NS=bench

if [ -z "$KIT" ] || [ ! -x "$KIT/up.sh" ] || [ ! -x "$KIT/lib/control-plane-down.sh" ]; then
  echo "set K8S_KIT to the cluster kit's directory (up.sh, lib/control-plane-down.sh; see docs/testing.md, "End-to-end tests on a real cluster")" >&2
  exit 1
fi
for tool in redis-server redis-cli python3; do
  command -v "$tool" >/dev/null || { echo "$tool not found" >&2; exit 1; }
done
if [ -z "${OPERATOR:-}" ]; then
  cargo build --quiet --release -p workerpool-operator
  OPERATOR=$TARGET/release/workerpool-operator
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
tmp=$(mktemp -d)
export K8S_STATE=$tmp/k8s NODE=0
APISERVER_PORT=$(free_port)
ETCD_PORT=$(free_port)
export APISERVER_PORT ETCD_PORT
redis_port=$(free_port)
metrics_port=$(free_port)

operator_pid=
redis_pid=
cleanup() {
  if [ -n "$operator_pid" ]; then kill "$operator_pid" 2>/dev/null || true; fi
  if [ -n "$redis_pid" ]; then kill "$redis_pid" 2>/dev/null || true; fi
  wait 2>/dev/null || true
  # The control plane only: down.sh would also stop the node of a cluster
  # that runs beside this one.
  "$KIT/lib/control-plane-down.sh" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

echo "starting a control plane (no node)..." >&2
KUBECONFIG=$("$KIT/up.sh" 2>"$tmp/up.log" | tail -n 1) || { cat "$tmp/up.log" >&2; exit 1; }
export KUBECONFIG
K8S_BIN=${K8S_BIN:-${TMPDIR:-/tmp}/k8s-bin-v1.28.7}
KUBECTL=${KUBECTL:-$K8S_BIN/kubectl}
[ -x "$KUBECTL" ] || KUBECTL=kubectl
k() { "$KUBECTL" "$@"; }
k apply --server-side -f manifests/crd.yaml >/dev/null
established() {
  k get crd workerpools.workerpool.dev \
    -o jsonpath='{.status.conditions[?(@.type=="Established")].status}' 2>/dev/null
}
until [ "$(established)" = True ]; do sleep 0.2; done
k create namespace "$NS" >/dev/null

redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" >"$tmp/redis.log" 2>&1 &
redis_pid=$!
cli() { redis-cli -p "$redis_port" "$@"; }
until cli ping >/dev/null 2>&1; do sleep 0.05; done
url="redis://127.0.0.1:$redis_port/0"

RUST_LOG=${RUST_LOG:-warn} "$OPERATOR" run --no-leader-election --namespace "$NS" \
  --listen "127.0.0.1:$metrics_port" >"$tmp/operator.log" 2>&1 &
operator_pid=$!

# One pool as YAML: scaled on its own queue, at zero while the queue is empty.
pool() {
  cat <<YAML
---
apiVersion: workerpool.dev/v1alpha1
kind: WorkerPool
metadata: {name: p$1, namespace: $NS}
spec:
  queue: {redis: {url: "$url", key: q$1}}
  template: {spec: {containers: [{name: worker, image: local/workerpool-worker:bench}]}}
  scaling: {minReplicas: 0, maxReplicas: 10, pollIntervalSeconds: $POLL}
YAML
}
deployments() { k get deployments -n "$NS" --no-headers 2>/dev/null | wc -l; }
# CPU ticks (user + system) of the operator, or of process $1; RSS in kB.
ticks() { awk '{print $14 + $15}' "/proc/${1:-$operator_pid}/stat"; }
# The API server of this control plane (the one on its own port).
apiserver_pid=$(pgrep -f "kube-apiserver .*--secure-port[= ]$APISERVER_PORT( |\$)" | head -n 1 || true)
apiserver_ticks() { if [ -n "$apiserver_pid" ]; then ticks "$apiserver_pid"; else echo 0; fi; }
rss_kb() { awk '/VmRSS/ {print $2}' "/proc/$operator_pid/status"; }
snapshots() {
  # A snapshot's transaction is the only EXEC the operator sends.
  cli INFO commandstats | tr -d '\r' | sed -n 's/^cmdstat_exec:calls=\([0-9]*\).*/\1/p' | head -n 1
}
hz=$(getconf CLK_TCK)

printf '%-7s %14s %12s %9s %9s %14s %12s %15s\n' \
  pools "create (s)" "all ready(s)" "RSS MB" "CPU %" "reads/poll" "wake-up (s)" "API server CPU%"
have=0
for total in $POOLS; do
  from=$((have + 1))
  for ((i = from; i <= total; i++)); do pool "$i"; done >"$tmp/pools.yaml"
  start=$(date +%s%N)
  # Four kubectl processes at once: the API server, not kubectl, is the limit.
  python3 - "$tmp/pools.yaml" "$tmp" <<'PY'
import sys
docs = open(sys.argv[1]).read().split("---\n")[1:]
for n in range(4):
    with open(f"{sys.argv[2]}/chunk{n}.yaml", "w") as f:
        f.write("".join("---\n" + d for d in docs[n::4]))
PY
  creating=()
  for n in 0 1 2 3; do
    k create -f "$tmp/chunk$n.yaml" >/dev/null &
    creating+=($!)
  done
  for pid in "${creating[@]}"; do wait "$pid"; done
  created=$(date +%s%N)
  until [ "$(deployments)" -ge "$total" ]; do sleep 0.5; done
  ready=$(date +%s%N)
  have=$total

  # Steady state: every pool read and decided each poll interval.
  sleep "$POLL"
  t0=$(ticks) a0=$(apiserver_ticks) s0=$(snapshots) w0=$(date +%s%N)
  perf_pid=
  if [ -n "${PERF_DATA:-}" ]; then
    perf record --quiet -F 199 --call-graph dwarf,16384 -p "$operator_pid" \
      -o "$PERF_DATA.$total" -- sleep "$STEADY" >/dev/null 2>&1 &
    perf_pid=$!
  fi
  peak=0
  for ((s = 0; s < STEADY; s++)); do
    r=$(rss_kb); [ "$r" -gt "$peak" ] && peak=$r
    sleep 1
  done
  t1=$(ticks) a1=$(apiserver_ticks) s1=$(snapshots) w1=$(date +%s%N)
  if [ -n "$perf_pid" ]; then wait "$perf_pid" || echo "perf record failed" >&2; fi
  wall=$(echo "($w1 - $w0) / 1000000000" | bc -l)
  cpu=$(echo "100 * ($t1 - $t0) / $hz / $wall" | bc -l)
  api_cpu=$(echo "100 * ($a1 - $a0) / $hz / $wall" | bc -l)
  reads=$(echo "($s1 - $s0) / $total / ($wall / $POLL)" | bc -l)

  # A backlog on one pool's queue: time until its Deployment scales up.
  probe=$(( (total + 1) / 2 ))
  backlog=()
  for ((j = 0; j < 200; j++)); do backlog+=('{"task":"bench"}'); done
  cli LPUSH "q$probe" "${backlog[@]}" >/dev/null
  pushed=$(date +%s%N)
  until [ "$(k get deployment "p$probe" -n "$NS" -o jsonpath='{.spec.replicas}')" -ge 1 ] 2>/dev/null; do sleep 0.1; done
  woke=$(date +%s%N)
  cli DEL "q$probe" >/dev/null

  printf '%-7s %14.1f %12.1f %9d %9.1f %14.2f %12.1f %15.1f\n' "$total" \
    "$(echo "($created - $start) / 1000000000" | bc -l)" \
    "$(echo "($ready - $start) / 1000000000" | bc -l)" \
    $((peak / 1024)) "$cpu" "$reads" \
    "$(echo "($woke - $pushed) / 1000000000" | bc -l)" "$api_cpu"
done
if grep -qi "error" "$tmp/operator.log"; then
  echo "operator errors (first 5):" >&2
  grep -i "error" "$tmp/operator.log" | head -n 5 >&2
fi
