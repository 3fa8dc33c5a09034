#!/usr/bin/env bash
# Makes sure sdk/node/node_modules is installed from package-lock.json
# (npm ci). Idempotent: installs again only when the lock file changed.
set -euo pipefail
cd "$(dirname "$0")/../sdk/node"
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --silent --no-audit --no-fund >&2
fi
