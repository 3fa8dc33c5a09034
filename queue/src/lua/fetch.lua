-- Takes up to `ARGV[1]` jobs from the queues in `KEYS` (pairs of queue and
-- processing list, highest priority first), each moved atomically.
-- Returns a flat list: queue index (1-based), payload, …
local n = tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS, 2 do
  while n > 0 do
    local v = redis.call('LMOVE', KEYS[i], KEYS[i + 1], 'RIGHT', 'LEFT')
    if not v then break end
    out[#out + 1] = (i + 1) / 2
    out[#out + 1] = v
    n = n - 1
  end
  if n == 0 then break end
end
return out
