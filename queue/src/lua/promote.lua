-- Moves due entries of the retry and scheduled sets to the tail of the
-- queue. KEYS: retry, scheduled, queue. ARGV: the most to move per set.
-- Returns how many moved.
local n = 0
for k = 1, 2 do
  local due = redis.call('ZRANGE', KEYS[k], '-inf', now, 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[1]))
  for _, v in ipairs(due) do
    redis.call('ZREM', KEYS[k], v)
    redis.call('LPUSH', KEYS[3], v)
    n = n + 1
  end
end
return n
