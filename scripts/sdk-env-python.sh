#!/usr/bin/env bash
# Makes sure target/sdk/venv exists with the Python SDK's pinned test
# dependencies (sdk/python/requirements-test.txt), then prints the path of
# its python. Idempotent: with the venv already matching the requirements it
# only compares a checksum.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/target/sdk/venv"
req="$root/sdk/python/requirements-test.txt"
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$req" | cut -d' ' -f1)"
if [[ ! -x "$venv/bin/python" || ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  python="${PYTHON:-python3}"
  if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 9))' 2>/dev/null; then
    echo "sdk-env-python: $python is missing or older than 3.9; set PYTHON to a newer one" >&2
    exit 1
  fi
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req" >&2
  echo "$want" > "$stamp"
fi
echo "$venv/bin/python"
