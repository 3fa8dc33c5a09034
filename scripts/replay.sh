#!/usr/bin/env bash
# The simulator held against a real cluster: a trace fed at its rates into a Redis
# on the cluster, served by the operator and worker Pods built from this checkout
# (jobs of a fixed 1 s), then the same trace through `workerpool-operator simulate`
# with the pod start-up and job duration that run measured; prints both side by side.
# It takes the trace's length (ten minutes for tests/replay/short.csv, the default).
#
#   WORKERPOOL_E2E_K8S=path/to/k8s scripts/replay.sh   # a cluster started and stopped for it
#   WORKERPOOL_E2E_KUBECONFIG=... scripts/replay.sh
#   scripts/replay.sh --trace my-trace.csv --out replay.md
#
# The cluster comes from WORKERPOOL_E2E_K8S or WORKERPOOL_E2E_KUBECONFIG, as for the
# end-to-end suite (docs/testing.md); helm from PATH or target/tools/bin.
set -euo pipefail
cd "$(dirname "$0")/.."

while [ $# -gt 0 ]; do
  case "$1" in
    --trace) WORKERPOOL_REPLAY_TRACE=$(realpath "$2"); export WORKERPOOL_REPLAY_TRACE; shift 2 ;;
    --out) WORKERPOOL_REPLAY_OUT=$(realpath -m "$2"); export WORKERPOOL_REPLAY_OUT; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ -z "${WORKERPOOL_E2E_K8S:-}${WORKERPOOL_E2E_KUBECONFIG:-}" ]; then
  echo "no cluster: set WORKERPOOL_E2E_K8S (a directory with up.sh and down.sh) or WORKERPOOL_E2E_KUBECONFIG" >&2
  exit 2
fi
./scripts/install-helm.sh >/dev/null
PATH="$PWD/target/tools/bin:$PATH" exec cargo test -p workerpool-tests --test e2e -- replay_a_trace_on_the_cluster_beside_the_simulator
