-- uses: guard.lua, now.lua
-- Reads entries of a list of dead letters without sending any long one
-- whole: a reader's memory is bounded by the page, not by the largest
-- entry (a too_large dead letter keeps a payload of any size).
-- KEYS: dead.
-- ARGV: the first index (as for LRANGE: 0 the newest, negative from the
-- oldest end), how many entries, the length up to which an entry comes
-- whole, the preview length of a longer one, the tail length, in bytes.
-- Returns one flat array: the list's length, then per entry its index
-- counted from the oldest end (-1 the oldest), its length in bytes, the
-- entry itself when it is short enough, else its first preview bytes;
-- then, for a whole entry, '' and '', else its last bytes (up to the tail
-- length) and the SHA-1 of the whole entry (hex), by which dead_pick.lua
-- finds it again.
local dead = KEYS[1]
expect(dead, 'list')
local first, count = tonumber(ARGV[1]), tonumber(ARGV[2])
local whole, preview, tail = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local len = redis.call('LLEN', dead)
local out = {len}
if first < 0 then
  first = math.max(len + first, 0)
end
-- One entry at a time (LINDEX), so the script itself holds one at most.
for i = first, math.min(first + count, len) - 1 do
  local e = redis.call('LINDEX', dead, i)
  if not e then
    break
  end
  local n = #e
  out[#out + 1] = i - len
  out[#out + 1] = n
  if n <= whole then
    out[#out + 1] = e
    out[#out + 1] = ''
    out[#out + 1] = ''
  else
    out[#out + 1] = string.sub(e, 1, preview)
    out[#out + 1] = string.sub(e, n - math.min(tail, n - preview) + 1)
    out[#out + 1] = redis.sha1hex(e)
  end
end
return out
