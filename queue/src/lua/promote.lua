-- uses: guard.lua, now.lua
-- Moves due entries of the retry and scheduled sets to the tail of the
-- queue. KEYS: retry, scheduled, queue. ARGV: the most to move per set.
-- Returns how many moved.
local retry, scheduled, queue = KEYS[1], KEYS[2], KEYS[3]
local limit = tonumber(ARGV[1])
expect(retry, 'zset')
expect(scheduled, 'zset')
expect(queue, 'list')
local n = 0
for _, set in ipairs({retry, scheduled}) do
  local due = redis.call('ZRANGE', set, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
  for _, v in ipairs(due) do
    redis.call('ZREM', set, v)
    redis.call('LPUSH', queue, v)
    n = n + 1
  end
end
return n
