#!/usr/bin/env bash
# The Python client library's tests (sdk/python/tests) against real
# redis-server processes and the workerpool-worker binary, then its lint.
# WORKERPOOL_BIN_DIR names the folder of workerpool-worker and workerpool
# (default target/debug, built when missing). Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="$("$root/scripts/sdk-env-python.sh")"
cd "$root"
"$python" -m pytest -q sdk/python/tests "$@"
"$python" -m ruff check sdk/python contract/adapters/python_adapter.py examples/video-platform/python
