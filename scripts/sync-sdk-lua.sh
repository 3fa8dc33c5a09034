#!/usr/bin/env bash
# Copies the Lua scripts the client libraries run into each package, from
# the one source, queue/src/lua: the scripts they run (enqueue.lua,
# cancel.lua) and every file their `-- uses:` lines name. Each package's
# tests fail when its copy differs; run this after changing one of those
# scripts.
set -euo pipefail
cd "$(dirname "$0")/.."

src=queue/src/lua
scripts=(enqueue.lua cancel.lua)
files=()
add() {
  local f
  for f in "${files[@]}"; do [ "$f" = "$1" ] && return; done
  files+=("$1")
}
for script in "${scripts[@]}"; do
  add "$script"
  uses=$(sed -n '1s/^-- uses: *//p' "$src/$script")
  IFS=',' read -ra named <<<"$uses"
  for entry in "${named[@]}"; do
    # "file.lua" or "file.lua as name(args)": the file is the first word.
    read -r file _ <<<"$entry"
    [ -n "$file" ] && add "$file"
  done
done

for dest in sdk/python/src/workerpool_client/lua sdk/node/lua; do
  [ -d "$(dirname "$dest")" ] || continue
  mkdir -p "$dest"
  for file in "${files[@]}"; do
    cp "$src/$file" "$dest/$file"
  done
  echo "$dest: ${files[*]}"
done
