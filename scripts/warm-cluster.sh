#!/usr/bin/env bash
# Starts and stops a cluster kit once, in the background, so that its first
# start (Debian packages installed, binaries unpacked, the base image built:
# minutes, mostly waiting on the mirror) runs beside the builds instead of
# inside the end-to-end suite.
#
#   scripts/warm-cluster.sh KIT    # prints a directory to use as WORKERPOOL_E2E_K8S
#
# The printed directory holds an up.sh that waits for the warm-up to end (a
# lock held for its whole length) before it runs KIT's, and a down.sh that
# runs KIT's. A warm-up that fails leaves the suite's own start to fail with
# the kit's message; the warm-up's output is in warm.log there.
set -euo pipefail
cd "$(dirname "$0")/.."

kit=$(cd "${1:?usage: scripts/warm-cluster.sh KIT}" && pwd)
dir="$PWD/target/warm-kit"
mkdir -p "$dir"
lock="$dir/warm.lock"

cat >"$dir/up.sh" <<EOF
#!/usr/bin/env bash
# Waits for scripts/warm-cluster.sh's warm-up, then starts the kit.
set -euo pipefail
flock "$lock" true
exec "$kit/up.sh"
EOF
cat >"$dir/down.sh" <<EOF
#!/usr/bin/env bash
exec "$kit/down.sh"
EOF
chmod +x "$dir/up.sh" "$dir/down.sh"

# The lock is taken here, before the warm-up is sent to the background, so an
# up.sh that comes at once still waits; the background job holds it (fd 9)
# until it ends.
exec 9>"$lock"
flock 9
(
  started=$SECONDS
  # The kit's daemons must not inherit the lock.
  if "$kit/up.sh" 9>&- && "$kit/down.sh" 9>&-; then
    echo "warm-cluster: the kit started and stopped in $((SECONDS - started)) s"
  else
    echo "warm-cluster: the kit's warm-up failed after $((SECONDS - started)) s"
  fi
) >"$dir/warm.log" 2>&1 &
exec 9>&-
echo "$dir"
