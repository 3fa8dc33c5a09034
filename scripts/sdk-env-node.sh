#!/usr/bin/env bash
# Makes sure sdk/node/node_modules holds the Node client's pinned
# dependencies (package-lock.json): `npm ci` when node_modules is missing or
# older than the lock file; nothing otherwise, so it is fast to run every
# time. Needs Node.js 20 or newer and npm.
set -euo pipefail
cd "$(dirname "$0")/../sdk/node"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "sdk-env-node: node and npm are needed (Node.js 20 or newer)" >&2
    exit 1
fi
major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$major" -lt 20 ]; then
    echo "sdk-env-node: Node.js $(node --version) is too old; the client needs 20 or newer" >&2
    exit 1
fi
# npm ci writes node_modules/.package-lock.json: older than the lock file
# means the dependencies changed since.
stamp=node_modules/.package-lock.json
if [ ! -f "$stamp" ] || [ package-lock.json -nt "$stamp" ]; then
    npm ci --no-audit --no-fund --loglevel=error >&2
    touch "$stamp"
fi
