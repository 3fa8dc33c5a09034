#!/usr/bin/env bash
# One version for the whole project: the Cargo workspace, the Helm chart,
# the manifests and the docs.
#
#   scripts/release.sh VERSION          # or: make release VERSION=X.Y.Z
#   scripts/release.sh --check
#   scripts/release.sh --notes VERSION
#
# VERSION sets the version everywhere it is named and dates the release in
# CHANGELOG.md:
#   Cargo.toml            [workspace.package] version (every crate inherits it)
#   Cargo.lock            the workspace crates' entries
#   charts/*/Chart.yaml   version and appVersion (chart and operator move together)
#   charts/*/values.yaml  image.tag, when it is set (empty means appVersion)
#   sdk/python/src/workerpool_client/_version.py   __version__ (the Python client)
#   sdk/node/package.json, package-lock.json        version (the Node.js client)
#   every other text file of the repository, CHANGELOG.md excepted:
#     ghcr.io/workerpool-dev/workerpool-operator:VERSION and …-worker:VERSION
#     (the examples, the README, manifests/install.yaml),
#     helm.sh/chart: workerpool-operator-VERSION and
#     app.kubernetes.io/version: "VERSION" (manifests/install.yaml),
#     oci://ghcr.io/workerpool-dev/charts/workerpool-operator --version VERSION
#     and …/releases/download/vVERSION/ (the README's install commands),
#     workerpool-client==VERSION (the Python client's install lines)
#   CHANGELOG.md          the notes under "## [Unreleased]" become
#                         "## [VERSION] - DATE" (the release notes); a
#                         version that already has its section keeps it
# then runs --check. It refuses a version without notes in CHANGELOG.md.
#
# --check exits 1, naming each file and line, when any of those places
# disagrees with the workspace version (CI and `make test` run it).
# --notes prints CHANGELOG.md's section for VERSION (the release workflow's
# release notes); it exits 1 when there is none or it is empty.
#
# VERSION is SemVer without a leading v: 1.2.3 or 1.2.3-rc.1 (no +build
# metadata: OCI tags and Kubernetes labels cannot carry it).
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "release.sh: $*" >&2; exit 1; }

# SemVer core and an optional pre-release, as an extended regex.
semver='[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?'
chart_dir=charts/workerpool-operator

# The places in free text: a prefix, then the version (then a suffix).
# Each entry is PREFIX<TAB>SUFFIX, extended regexes without groups; the
# version sits between.
text_places=(
  $'ghcr\\.io/workerpool-dev/workerpool-operator:\t'
  $'ghcr\\.io/workerpool-dev/workerpool-worker:\t'
  $'helm\\.sh/chart: workerpool-operator-\t'
  $'app\\.kubernetes\\.io/version: "\t"'
  $'oci://ghcr\\.io/workerpool-dev/charts/workerpool-operator --version \t'
  $'workerpool-dev/workerpool/releases/download/v\t/'
  $'workerpool-client==\t'
)

# The client libraries' own version fields.
py_version=sdk/python/src/workerpool_client/_version.py
node_package=sdk/node/package.json
node_lock=sdk/node/package-lock.json

# Prints LINE<TAB>VERSION for each of the Node package's versions in FILE:
# the top-level "version" (two spaces in), and in a lock file the root
# package's (six spaces in, under `"": {`).
node_versions() {
  awk '
    /^  "version": "/ { v = $0; gsub(/^  "version": "|",?$/, "", v); print NR "\t" v }
    /^    "": \{/ { root = 1; next }
    root && /^      "version": "/ { v = $0; gsub(/^      "version": "|",?$/, "", v); print NR "\t" v; root = 0 }
    root && /^    }/ { root = 0 }' "$1"
}

# The repository's files: git's list in a checkout, else every file outside
# build output (a copy of the tree, an unpacked source archive).
repo_files() {
  if [ "$(git rev-parse --show-toplevel 2>/dev/null)" = "$PWD" ]; then
    git ls-files -z | while IFS= read -r -d '' f; do
      [ -f "$f" ] && printf '%s\n' "$f"
    done
  else
    find . -type f -not -path './.git/*' -not -path './target/*' -not -path './target-*' \
      -not -path '*/node_modules/*' | sed 's|^\./||'
  fi
}

# The text files that can name the version in free text.
text_files() {
  repo_files | grep -v -x -e CHANGELOG.md | sort
}

workspace_version() {
  awk '/^\[/ { section = $0 } section == "[workspace.package]" && /^version = "/ {
         gsub(/^version = "|"$/, ""); print; exit }' Cargo.toml
}

# The workspace crates' package names, from the members' manifests.
member_names() {
  local members dir
  members=$(sed -n 's/^members = \[\(.*\)\]/\1/p' Cargo.toml | tr -d '" ' | tr ',' ' ')
  [ -n "$members" ] || die "Cargo.toml: no one-line 'members = [...]' list"
  for dir in $members; do
    awk '/^name = "/ { gsub(/^name = "|"$/, ""); print; exit }' "$dir/Cargo.toml"
  done
}

# Prints FILE:LINE:VERSION for every place that names a version.
places() {
  local entry prefix suffix
  # Cargo.toml and the members inherit it: a member with its own is a place.
  echo "Cargo.toml:$(grep -n '^version = "' Cargo.toml | head -n 1 | cut -d: -f1):$(workspace_version)"
  local members dir
  members=$(sed -n 's/^members = \[\(.*\)\]/\1/p' Cargo.toml | tr -d '" ' | tr ',' ' ')
  for dir in $members; do
    grep -nE '^version *= *"' "$dir/Cargo.toml" | sed -E "s|^([0-9]+):version *= *\"(.*)\".*|$dir/Cargo.toml:\1:\2|" || true
  done
  local names
  names=$(member_names | tr '\n' ' ')
  awk -v names="$names" '
    BEGIN { n = split(names, list, " "); for (i = 1; i <= n; i++) want["name = \"" list[i] "\""] = 1 }
    want[$0] { mark = 1; next }
    mark && /^version = "/ { v = $0; gsub(/^version = "|"$/, "", v); print "Cargo.lock:" NR ":" v; mark = 0 }
  ' Cargo.lock
  grep -nE '^(version|appVersion):' "$chart_dir/Chart.yaml" |
    sed -E "s|^([0-9]+):[a-zA-Z]+: *\"?([^\"]*)\"?.*|$chart_dir/Chart.yaml:\1:\2|"
  awk -v file="$chart_dir/values.yaml" '
    /^[^ #]/ { block = $0 }
    block == "image:" && /^  tag:/ {
      v = $0; sub(/^  tag: */, "", v); sub(/ *#.*$/, "", v); gsub(/"/, "", v)
      if (v != "") print file ":" NR ":" v
    }' "$chart_dir/values.yaml"
  sed -nE "s|^__version__ = \"(.*)\"\$|\1|p" "$py_version" | head -n 1 |
    sed "s|^|$py_version:$(grep -n '^__version__ = ' "$py_version" | head -n 1 | cut -d: -f1):|"
  local file line v
  for file in "$node_package" "$node_lock"; do
    while IFS=$'\t' read -r line v; do
      echo "$file:$line:$v"
    done < <(node_versions "$file")
  done
  local files
  mapfile -t files < <(text_files)
  for entry in "${text_places[@]}"; do
    prefix=${entry%%$'\t'*}
    suffix=${entry#*$'\t'}
    grep -HnoIE -- "$prefix$semver$suffix" "${files[@]}" 2>/dev/null |
      sed -E "s#^([^:]*):([0-9]+):$prefix($semver)$suffix\$#\1:\2:\3#" || true
  done
}

check() {
  local want count=0 bad=0 file line found
  want=$(workspace_version)
  [ -n "$want" ] || die "Cargo.toml: no version under [workspace.package]"
  while IFS=: read -r file line found; do
    count=$((count + 1))
    if [ "$found" != "$want" ]; then
      echo "$file:$line: $found, not the workspace version $want" >&2
      bad=$((bad + 1))
    fi
  done < <(places)
  if [ "$bad" -gt 0 ]; then
    echo "release.sh: $bad of $count places disagree with $want; scripts/release.sh $want sets them all" >&2
    return 1
  fi
  echo "release.sh: $count places name version $want"
}

# CHANGELOG.md's section for $1, without its heading and outer blank lines.
notes() {
  [ -f CHANGELOG.md ] || die "no CHANGELOG.md"
  awk -v v="$1" '
    /^## / { if (inside) exit; if (index($0, "## [" v "]") == 1) { inside = 1; next } }
    inside { lines[++n] = $0 }
    END {
      first = 1; while (first <= n && lines[first] ~ /^[[:space:]]*$/) first++
      last = n; while (last >= first && lines[last] ~ /^[[:space:]]*$/) last--
      for (i = first; i <= last; i++) print lines[i]
    }' CHANGELOG.md
}

# Whether CHANGELOG.md has a section for $1.
has_section() {
  awk -v v="$1" 'index($0, "## [" v "]") == 1 { found = 1 } END { exit !found }' CHANGELOG.md
}

set_version() {
  local new=$1 old names files file entry prefix suffix
  old=$(workspace_version)
  [ -n "$old" ] || die "Cargo.toml: no version under [workspace.package]"
  # The notes are read whole before they are looked at: `notes | grep -q`
  # would fail under pipefail whenever grep stops reading early (SIGPIPE).
  local text
  if has_section "$new"; then
    text=$(notes "$new")
    [[ $text == *[^[:space:]]* ]] || die "CHANGELOG.md: the section of $new is empty"
  else
    text=$(notes Unreleased)
    [[ $text == *[^[:space:]]* ]] ||
      die "CHANGELOG.md has no section for $new and nothing under '## [Unreleased]': write the release notes first"
  fi
  tmp=$(mktemp)
  trap 'rm -f "$tmp"' EXIT

  # Cargo.toml's [workspace.package] version; the crates inherit it.
  awk -v v="$new" '/^\[/ { section = $0 }
    section == "[workspace.package]" && /^version = "/ && !done { print "version = \"" v "\""; done = 1; next }
    { print }' Cargo.toml >"$tmp" && cat "$tmp" >Cargo.toml

  # Cargo.lock: the version line after each workspace crate's name.
  names=$(member_names | tr '\n' ' ')
  awk -v v="$new" -v names="$names" '
    BEGIN { n = split(names, list, " "); for (i = 1; i <= n; i++) want["name = \"" list[i] "\""] = 1 }
    want[$0] { print; mark = 1; next }
    mark && /^version = "/ { print "version = \"" v "\""; mark = 0; next }
    { print }' Cargo.lock >"$tmp" && cat "$tmp" >Cargo.lock

  # The chart: its own version and the operator's (the default image tag).
  sed -E -e "s/^version:.*/version: $new/" -e "s/^appVersion:.*/appVersion: \"$new\"/" \
    "$chart_dir/Chart.yaml" >"$tmp" && cat "$tmp" >"$chart_dir/Chart.yaml"
  awk -v v="$new" '/^[^ #]/ { block = $0 }
    block == "image:" && /^  tag: *"[^"]+"/ { sub(/"[^"]+"/, "\"" v "\"") }
    { print }' "$chart_dir/values.yaml" >"$tmp" && cat "$tmp" >"$chart_dir/values.yaml"

  # The client libraries: the Python package's __version__, the Node
  # package's version (package.json, and its lock file's two copies).
  sed -E "s/^__version__ = \".*\"\$/__version__ = \"$new\"/" "$py_version" >"$tmp" &&
    cat "$tmp" >"$py_version"
  for file in "$node_package" "$node_lock"; do
    awk -v v="$new" '
      /^  "version": "/ { sub(/"version": "[^"]*"/, "\"version\": \"" v "\"") }
      /^    "": \{/ { root = 1 }
      root && /^      "version": "/ { sub(/"version": "[^"]*"/, "\"version\": \"" v "\""); root = 0 }
      root && /^    }/ { root = 0 }
      { print }' "$file" >"$tmp" && cat "$tmp" >"$file"
  done

  # Free text: image references, chart labels, install commands.
  mapfile -t files < <(text_files)
  for entry in "${text_places[@]}"; do
    prefix=${entry%%$'\t'*}
    suffix=${entry#*$'\t'}
    while IFS= read -r file; do
      sed -E "s#($prefix)$semver($suffix)#\\1$new\\3#g" "$file" >"$tmp" && cat "$tmp" >"$file"
    done < <(grep -lIE -- "$prefix$semver$suffix" "${files[@]}" 2>/dev/null || true)
  done

  # CHANGELOG.md: the Unreleased notes become the version's section.
  if ! has_section "$new"; then
    awk -v v="$new" -v date="$(date -u +%Y-%m-%d)" '
      !done && /^## \[Unreleased\]/ { print; print ""; print "## [" v "] - " date; done = 1; next }
      { print }' CHANGELOG.md >"$tmp" && cat "$tmp" >CHANGELOG.md
  fi

  echo "release.sh: $old -> $new"
  check
}

case "${1:-}" in
  --check)
    [ $# -eq 1 ] || die "usage: scripts/release.sh --check"
    check
    ;;
  --notes)
    [ $# -eq 2 ] || die "usage: scripts/release.sh --notes VERSION"
    text=$(notes "$2")
    [ -n "$text" ] || die "CHANGELOG.md has no notes under '## [$2]'"
    printf '%s\n' "$text"
    ;;
  -h | --help)
    sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
    ;;
  '' | -*)
    die "usage: scripts/release.sh VERSION | --check | --notes VERSION (see --help)"
    ;;
  *)
    [ $# -eq 1 ] || die "usage: scripts/release.sh VERSION"
    echo "$1" | grep -qxE "$semver" ||
      die "'$1' is not a version like 1.2.3 or 1.2.3-rc.1 (no leading v, no +build)"
    set_version "$1"
    ;;
esac
