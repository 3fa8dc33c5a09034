#!/usr/bin/env bash
# The release checks, with the real tools, in seconds (make release-check,
# part of make test):
#
#   ShellCheck   every shell script of the repository
#   hadolint     images/*/Dockerfile, with .hadolint.yaml
#   actionlint   .github/workflows/*.yml
#   helm         the chart packaged as the release packages it (version and
#                appVersion from the workspace), then helm lint --strict on
#                the package
#   versions     scripts/release.sh --check: one version everywhere
#   ruff         the Python client and its conformance adapter
#   tsc          the Node.js client's TypeScript types (tsc --noEmit)
#   sdk lua      the clients' Lua scripts are the queue's own
#                (scripts/sync-sdk-lua.sh changes nothing)
#
# Runs every check, then exits 1 if any failed. The linters come from
# scripts/install-lint-tools.sh (target/tools/bin) and helm from
# scripts/install-helm.sh; SHELLCHECK, HADOLINT, ACTIONLINT and HELM name
# other binaries.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-lint-tools.sh
tools="$PWD/target/tools/bin"
shellcheck=${SHELLCHECK:-shellcheck}
hadolint=${HADOLINT:-$tools/hadolint}
actionlint=${ACTIONLINT:-$tools/actionlint}
helm=$(scripts/install-helm.sh)

work="$(mktemp -d "${TMPDIR:-/tmp}/release-check.XXXXXX")"
trap 'rm -rf "$work"' EXIT

passed=0
failed=0
# run NAME COMMAND...: one check, its output kept on failure.
run() {
  local name=$1
  shift
  if "$@" >"$work/out" 2>&1; then
    passed=$((passed + 1))
    echo "release-check: $name: ok"
  else
    failed=$((failed + 1))
    echo "release-check: $name: FAILED" >&2
    sed 's/^/  /' "$work/out" >&2
  fi
}

# The repository's files: git's list in a checkout, else every file outside
# build output.
repo_files() {
  if [ "$(git rev-parse --show-toplevel 2>/dev/null)" = "$PWD" ]; then
    git ls-files
  else
    find . -type f -not -path './.git/*' -not -path './target/*' -not -path './target-*' \
      -not -path '*/node_modules/*' | sed 's|^\./||'
  fi
}

# Shell scripts: *.sh, and files whose first line runs sh or bash.
scripts=()
while IFS= read -r file; do
  [ -f "$file" ] || continue
  case "$file" in
    *.sh) scripts+=("$file") ;;
    *) head -n 1 "$file" 2>/dev/null | grep -qE '^#!.*[/ ](ba)?sh( |$)' && scripts+=("$file") ;;
  esac
done < <(repo_files | sort)
[ ${#scripts[@]} -gt 0 ] || { echo "release-check: no shell scripts found" >&2; exit 1; }
run "shellcheck (${#scripts[@]} scripts)" "$shellcheck" "${scripts[@]}"

run "hadolint (images/*/Dockerfile)" "$hadolint" --no-color --config .hadolint.yaml images/*/Dockerfile

workflows=(.github/workflows/*.yml)
run "actionlint (${#workflows[@]} workflows)" "$actionlint" "${workflows[@]}"

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
chart() {
  "$helm" package charts/workerpool-operator --version "$version" --app-version "$version" \
    --destination "$work/chart" &&
    "$helm" lint --strict "$work/chart/workerpool-operator-$version.tgz"
}
run "helm package + lint --strict (workerpool-operator-$version.tgz)" chart

run "versions (scripts/release.sh --check)" scripts/release.sh --check

# The client libraries, with their pinned tools (target/sdk/venv,
# sdk/node/node_modules: installed on first use).
python=$(scripts/sdk-env-python.sh)
run "ruff (sdk/python, contract/adapters)" "$python" -m ruff check sdk/python contract/adapters/python_adapter.py
run "tsc --noEmit (sdk/node types)" bash -c 'scripts/sdk-env-node.sh && sdk/node/node_modules/.bin/tsc --noEmit -p sdk/node'
sdk_lua() {
  local copies=(sdk/python/src/workerpool_client/lua sdk/node/lua) before after
  before=$(cat "${copies[@]/%//*.lua}" | sha256sum)
  scripts/sync-sdk-lua.sh >/dev/null
  after=$(cat "${copies[@]/%//*.lua}" | sha256sum)
  [ "$before" = "$after" ] || { echo "the clients' Lua scripts differed from queue/src/lua; scripts/sync-sdk-lua.sh has copied them over: commit the change"; return 1; }
}
run "sdk lua (the clients' scripts are queue/src/lua's)" sdk_lua

echo "release-check: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
