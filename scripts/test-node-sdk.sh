#!/usr/bin/env bash
# The Node.js client's tests: its environment (scripts/sdk-env-node.sh),
# the test files with node's test runner against real redis-server
# processes and the real workerpool-worker (WORKERPOOL_BIN_DIR, default
# target/debug, built when missing), then the types with tsc --noEmit.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/sdk-env-node.sh
node --test sdk/node/test/*.test.mjs
sdk/node/node_modules/.bin/tsc --noEmit -p sdk/node
echo "sdk/node: types check (tsc --noEmit)"
