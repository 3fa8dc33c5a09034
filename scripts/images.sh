#!/usr/bin/env bash
# Builds the operator and worker images, and the Python client's example
# image on the worker's, from this checkout without a Docker daemon or a
# registry, and loads them into a cluster's container runtime.
#
#   scripts/images.sh          # or: make images
#
# The images are the runtime stages of images/*/Dockerfile, assembled with
# umoci and skopeo from binaries built here (debug by default; the debug
# information is stripped, as a release build would be small):
#   local/workerpool-operator:TAG  a distroless-like root: the binary, the C
#                                  libraries it links, CA certificates, user
#                                  65532 (nonroot); ENTRYPOINT the operator, CMD run
#   local/workerpool-worker:TAG    Debian bookworm with user 65532 (workerpool,
#                                  home /app), workerpool-worker and workerpool in
#                                  /usr/local/bin, tini, WORKDIR /app; ENTRYPOINT
#                                  tini -s -- the worker
#   local/workerpool-python-example:TAG
#                                  sdk/python/examples/mini_project/Dockerfile
#                                  (the Python client README's image) on the
#                                  worker image: a venv in /opt/venv with this
#                                  checkout's workerpool-client and its pinned
#                                  redis-py, the app in /app/mini, PATH with
#                                  /opt/venv/bin first, user 65532, CMD
#                                  --handler exec -- python3 -m mini.worker
# Archives go to target/images/*.tar (docker-archive format). At the end the
# script prints the three image names (repository:tag) and their archives, and
# where it loaded them: the names to give the chart (image.repository,
# image.tag) and a WorkerPool's worker container (image).
#
# Env:
#   PROFILE       debug (default) or release: which cargo build to use
#   BIN_DIR       take the binaries from this directory instead of building them
#   TAG           image tag (default dev)
#   BASE_ARCHIVE  docker-archive of a Debian bookworm root for the worker image;
#                 default: the one-node cluster kit's local/debian:12
#                 ($NODE_STATE/images), else one made with mmdebstrap (minbase,
#                 python3 for example handlers) and kept in target/images/
#   IMAGE_LOAD    command that loads an archive into the cluster, run as
#                 `$IMAGE_LOAD FILE.tar` (kind: "kind load image-archive");
#                 default: ctr into the kit's containerd when its socket
#                 exists, else the archives are only built
# Needs umoci, skopeo, binutils' strip and tini's tini-static
# (apt-get install -y umoci skopeo binutils tini), chroot (the example's venv
# is made by the image's own python3), and python3 for
# scripts/sdk-env-python.sh, whose pip downloads the example's pinned wheels
# from PyPI once (kept in target/images/wheels).
set -euo pipefail
cd "$(dirname "$0")/.."

PROFILE=${PROFILE:-debug}
TAG=${TAG:-dev}
OUT=${CARGO_TARGET_DIR:-target}/images
NODE_STATE=${NODE_STATE:-/var/lib/k8s-node}
NODE_RUN=${NODE_RUN:-/run/k8s-node}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

die() { echo "images.sh: $*" >&2; exit 1; }
for tool in umoci skopeo strip tini-static; do
  command -v "$tool" >/dev/null || die "missing $tool (apt-get install -y umoci skopeo binutils tini)"
done

if [ -z "${BIN_DIR:-}" ]; then
  flags=()
  [ "$PROFILE" = release ] && flags+=(--release)
  # The whole workspace with its examples: one set of features, as the tests
  # build it, so a build for them serves.
  cargo build --locked "${flags[@]}" --workspace --bins --examples
  BIN_DIR=${CARGO_TARGET_DIR:-target}/$PROFILE
fi
for bin in workerpool-operator workerpool-worker workerpool; do
  [ -x "$BIN_DIR/$bin" ] || die "no $bin in $BIN_DIR"
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# save LAYOUT[:REF] NAME: the OCI layout's image (ref img by default) as a
# docker-archive named NAME:TAG.
save() {
  local file
  file="$OUT/$(basename "$2").tar"
  rm -f "$file"
  local ref=$1
  [[ $ref == *:* ]] || ref=$ref:img
  skopeo copy -q "oci:$ref" "docker-archive:$file:$2:$TAG"
  echo "$file"
}

# Where load put the images, for the summary at the end.
loaded_into=''
load() {
  if [ -n "${IMAGE_LOAD:-}" ]; then
    # shellcheck disable=SC2086 # IMAGE_LOAD is a command with its arguments
    $IMAGE_LOAD "$1"
    loaded_into="the cluster, with: $IMAGE_LOAD"
  elif [ -S "$NODE_RUN/containerd.sock" ]; then
    ctr -a "$NODE_RUN/containerd.sock" -n k8s.io images import "$1" >/dev/null
    echo "loaded $1 into the node's containerd"
    loaded_into="the node's containerd ($NODE_RUN/containerd.sock, namespace k8s.io)"
  fi
}

# The operator: what gcr.io/distroless/static-debian12:nonroot holds (CA
# certificates, the nonroot user), the libraries this build of the binary
# links (the Dockerfile's is a static musl build, that links none), and
# nothing else: no shell.
op="$work/operator"
mkdir -p "$op/usr/local/bin" "$op/etc/ssl/certs" "$op/tmp" "$op/home/nonroot"
strip --strip-debug -o "$op/usr/local/bin/workerpool-operator" "$BIN_DIR/workerpool-operator"
chmod 0755 "$op/usr/local/bin/workerpool-operator"
# Every library the dynamic linker resolves, and the linker itself.
for lib in $(ldd "$BIN_DIR/workerpool-operator" | grep -o '/[^ ]*'); do
  mkdir -p "$op$(dirname "$lib")"
  cp -L "$lib" "$op$lib"
done
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  cp /etc/ssl/certs/ca-certificates.crt "$op/etc/ssl/certs/"
fi
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$op/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$op/etc/group"
chmod 1777 "$op/tmp"
chown 65532:65532 "$op/home/nonroot"
chmod 0700 "$op/home/nonroot"
umoci init --layout "$work/op"
umoci new --image "$work/op:img"
umoci insert --image "$work/op:img" "$op" / >/dev/null
umoci config --image "$work/op:img" --os linux --architecture amd64 \
  --config.user 65532:65532 \
  --config.env PATH=/usr/local/bin:/usr/bin:/bin \
  --config.env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
  --config.exposedports 8080/tcp \
  --config.entrypoint /usr/local/bin/workerpool-operator \
  --config.cmd run
operator_image=local/workerpool-operator:$TAG
operator_archive=$(save "$work/op" local/workerpool-operator)
load "$operator_archive"

# The worker: images/worker/Dockerfile's runtime stage on a Debian bookworm root.
if [ -z "${BASE_ARCHIVE:-}" ]; then
  if [ -f "$NODE_STATE/images/local_debian_12.tar" ]; then
    BASE_ARCHIVE=$NODE_STATE/images/local_debian_12.tar
  else
    BASE_ARCHIVE=$OUT/debian-bookworm.tar
    if [ ! -f "$BASE_ARCHIVE" ]; then
      command -v mmdebstrap >/dev/null || die "missing mmdebstrap for the base image (or set BASE_ARCHIVE)"
      mmdebstrap --quiet --variant=minbase --include=ca-certificates,python3 bookworm "$work/base-root"
      rm -rf "$work/base-root/var/lib/apt/lists/"*
      umoci init --layout "$work/base"
      umoci new --image "$work/base:img"
      umoci insert --image "$work/base:img" "$work/base-root" / >/dev/null
      umoci config --image "$work/base:img" --os linux --architecture amd64 \
        --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
      skopeo copy -q "oci:$work/base:img" "docker-archive:$BASE_ARCHIVE:local/debian-bookworm:base"
    fi
  fi
fi
skopeo copy -q "docker-archive:$BASE_ARCHIVE" "oci:$work/wk:img"
umoci unpack --image "$work/wk:img" "$work/wk-bundle" >/dev/null
root="$work/wk-bundle/rootfs"
# groupadd/useradd as the Dockerfile runs them (the same lines they write).
grep -q '^workerpool:' "$root/etc/group" || echo 'workerpool:x:65532:' >>"$root/etc/group"
grep -q '^workerpool:' "$root/etc/passwd" ||
  echo 'workerpool:x:65532:65532::/app:/usr/sbin/nologin' >>"$root/etc/passwd"
if [ -f "$root/etc/shadow" ] && ! grep -q '^workerpool:' "$root/etc/shadow"; then
  echo 'workerpool:!:20000:0:99999:7:::' >>"$root/etc/shadow"
fi
install -d -o 65532 -g 65532 "$root/app"
# The Dockerfile installs ca-certificates; a root without them gets the bundle.
if [ ! -f "$root/etc/ssl/certs/ca-certificates.crt" ] && [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
fi
for bin in workerpool-worker workerpool; do
  strip --strip-debug -o "$root/usr/local/bin/$bin" "$BIN_DIR/$bin"
  chmod 0755 "$root/usr/local/bin/$bin"
done
# PID 1, as the Dockerfile's Debian package: tini-static runs on any root.
if [ ! -x "$root/usr/bin/tini" ]; then
  install -D -m 0755 "$(command -v tini-static)" "$root/usr/bin/tini"
fi
umoci repack --image "$work/wk:img" "$work/wk-bundle" >/dev/null
umoci config --image "$work/wk:img" --os linux --architecture amd64 \
  --config.user 65532:65532 \
  --config.workingdir /app \
  --config.exposedports 8080/tcp \
  --clear=config.cmd \
  --config.entrypoint /usr/bin/tini \
  --config.entrypoint=-s \
  --config.entrypoint=-- \
  --config.entrypoint /usr/local/bin/workerpool-worker
worker_image=local/workerpool-worker:$TAG
worker_archive=$(save "$work/wk" local/workerpool-worker)
load "$worker_archive"

# The Python example: sdk/python/examples/mini_project/Dockerfile (the
# client README's image) on the worker image just built, step for step. Its
# RUN makes a venv in /opt/venv and pip-installs workerpool-client there:
# here the image's own python3 makes the venv (in a chroot of the worker's
# root, which has python3; pip comes from outside, hence --without-pip), and
# the host's pip installs this checkout's client as a wheel and the redis-py
# it requires (at the pin of sdk/python/requirements-test.txt, with what
# redis-py needs on the image's Python) into the venv's site-packages. Its
# COPY puts the app in /app/mini. Each step is a layer of its own.
if [ ! -x "$root/usr/bin/python3" ]; then
  die "the worker image's base has no python3, which the Python example image needs (BASE_ARCHIVE=$BASE_ARCHIVE)"
fi
py=$(scripts/sdk-env-python.sh)
example=sdk/python/examples/mini_project
chroot "$root" /usr/bin/python3 -m venv --without-pip /opt/venv
image_python=$(chroot "$root" /opt/venv/bin/python3 -c 'import platform; print(platform.python_version())')
site=$(chroot "$root" /opt/venv/bin/python3 -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
mkdir -p "$work/py-venv/opt"
mv "$root/opt/venv" "$work/py-venv/opt/venv"
wheels="$OUT/wheels"
mkdir -p "$wheels" "$work/py-wheels"
"$py" -m build --wheel --no-isolation --outdir "$work/py-wheels" sdk/python >/dev/null
# The requirements pip would install with the package on the image's
# Python, each at its pin in requirements-test.txt, as pure-Python wheels
# (downloaded once, kept in target/images/wheels).
"$py" - "$image_python" sdk/python/requirements-test.txt "$wheels" "$work/py-wheels" <<'PY'
import glob, shutil, subprocess, sys, zipfile
from email.parser import Parser
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

version, pins_file, cache, out = sys.argv[1:5]
env = {"python_version": ".".join(version.split(".")[:2]), "python_full_version": version, "extra": ""}
pins = {}
for line in open(pins_file):
    line = line.split("#")[0].split(";")[0].strip()
    if line:
        pins[canonicalize_name(Requirement(line).name)] = line

def requires(wheel):
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    return [Requirement(r) for r in Parser().parsestr(text).get_all("Requires-Dist") or []]

def wheel_of(pin):
    name, version = pin.split("==")
    pattern = f"{cache}/{canonicalize_name(name).replace('-', '_')}-{version}-py3-none-any.whl"
    if not glob.glob(pattern):
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                        "--no-deps", "--only-binary=:all:", "--dest", cache, pin], check=True)
    found = glob.glob(pattern)
    if not found:
        sys.exit(f"images.sh: {pin} has no pure-Python wheel ({pattern})")
    return found[0]

todo, seen = requires(glob.glob(f"{out}/*.whl")[0]), set()
while todo:
    r = todo.pop()
    name = canonicalize_name(r.name)
    if name in seen or (r.marker and not r.marker.evaluate(env)):
        continue
    seen.add(name)
    if name not in pins:
        sys.exit(f"images.sh: {r.name} (required on Python {version}) has no pin in {pins_file}: add one")
    wheel = wheel_of(pins[name])
    shutil.copy(wheel, out)
    todo.extend(requires(wheel))
PY
"$py" -m pip install --quiet --disable-pip-version-check --no-deps --no-index \
  --target "$work/py-venv$site" "$work"/py-wheels/*.whl
mkdir -p "$work/py-app/mini"
cp -R "$example/mini/." "$work/py-app/mini/"
find "$work/py-app" -name __pycache__ -prune -exec rm -rf {} +
chown -R 0:0 "$work/py-venv" "$work/py-app"
umoci tag --image "$work/wk:img" py
umoci insert --image "$work/wk:py" "$work/py-venv/opt/venv" /opt/venv >/dev/null
umoci insert --image "$work/wk:py" "$work/py-app/mini" /app/mini >/dev/null
base_path=$(skopeo inspect --config "oci:$work/wk:img" | "$py" -c \
  'import json, sys; print(next((e[5:] for e in json.load(sys.stdin)["config"].get("Env", []) if e.startswith("PATH=")), "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"))')
umoci config --image "$work/wk:py" --os linux --architecture amd64 \
  --config.user 65532:65532 \
  --config.env "PATH=/opt/venv/bin:$base_path" \
  --config.cmd=--handler \
  --config.cmd exec \
  --config.cmd=-- \
  --config.cmd python3 \
  --config.cmd=-m \
  --config.cmd mini.worker
python_image=local/workerpool-python-example:$TAG
python_archive=$(save "$work/wk:py" local/workerpool-python-example)
load "$python_archive"

echo
echo "images built:"
echo "  $operator_image  ($operator_archive)"
echo "  $worker_image  ($worker_archive)"
echo "  $python_image  ($python_archive)"
if [ -n "$loaded_into" ]; then
  echo "loaded into $loaded_into"
else
  echo "not loaded into a cluster: kind load image-archive FILE.tar, or"
  echo "  ctr -n k8s.io images import FILE.tar on the node (or IMAGE_LOAD=... make images)"
fi
echo "use them:"
echo "  helm install workerpool-operator charts/workerpool-operator -n workerpool-system --create-namespace \\"
echo "    --set image.repository=${operator_image%:*} --set image.tag=$TAG"
echo "  and in a WorkerPool's worker container: image: $worker_image"
echo "  (or $python_image, which runs the Python mini project's handler)"
