#!/usr/bin/env bash
# Makes sure target/sdk/venv exists with the Python client's pinned test
# dependencies (sdk/python/requirements-test.txt) and prints its python's
# path. Idempotent: installs again only when the requirements changed.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/sdk/venv
requirements=sdk/python/requirements-test.txt
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" >&2
fi
if [ -f "$requirements" ] && { [ ! -f "$venv/.installed" ] || [ "$requirements" -nt "$venv/.installed" ]; }; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements" >&2
  touch "$venv/.installed"
fi
echo "$PWD/$venv/bin/python"
