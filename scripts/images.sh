#!/usr/bin/env bash
# Builds the operator and worker images from this checkout without a Docker
# daemon or a registry, and loads them into a cluster's container runtime.
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
# Archives go to target/images/*.tar (docker-archive format). At the end the
# script prints the two image names (repository:tag) and their archives, and
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
# (apt-get install -y umoci skopeo binutils tini).
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
  cargo build --locked "${flags[@]}" -p workerpool-operator -p workerpool-worker -p workerpool-cli --bins
  BIN_DIR=${CARGO_TARGET_DIR:-target}/$PROFILE
fi
for bin in workerpool-operator workerpool-worker workerpool; do
  [ -x "$BIN_DIR/$bin" ] || die "no $bin in $BIN_DIR"
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# save LAYOUT NAME: the OCI layout's image as a docker-archive named NAME:TAG.
save() {
  local file
  file="$OUT/$(basename "$2").tar"
  rm -f "$file"
  skopeo copy -q "oci:$1:img" "docker-archive:$file:$2:$TAG"
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

echo
echo "images built:"
echo "  $operator_image  ($operator_archive)"
echo "  $worker_image  ($worker_archive)"
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
