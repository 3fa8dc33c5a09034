-- Takes up to `ARGV[1]` jobs from the queues in `KEYS` (pairs of queue and
-- processing list, highest priority first), each moved atomically and
-- stamped on the way (stamp.lua).
-- KEYS: pairs of queue and processing list, highest priority first.
-- ARGV: how many jobs to take; the pool's attempt limit; one 32-digit hex
-- id per job to take, concatenated (for jobs that arrive without one).
-- Returns a flat list: queue index (1-based), payload as held, stamp, …
local n = tonumber(ARGV[1])
local max_attempts, ids = tonumber(ARGV[2]), ARGV[3]
local out = {}
for i = 1, #KEYS, 2 do
  local waiting, processing = KEYS[i], KEYS[i + 1]
  while n > 0 do
    local v = redis.call('RPOP', waiting)
    if not v then break end
    local k = #out / 3
    local held, how = stamp(v, max_attempts, string.sub(ids, 32 * k + 1, 32 * k + 32))
    redis.call('LPUSH', processing, held)
    out[#out + 1] = (i + 1) / 2
    out[#out + 1] = held
    out[#out + 1] = how
    n = n - 1
  end
  if n == 0 then break end
end
return out
