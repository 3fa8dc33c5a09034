-- Completes a job and, in the same round trip, takes the next one into
-- the freed slot. KEYS: processing and stats:processed of the completed
-- job's queue, then pairs of queue and processing list, highest priority
-- first. ARGV: the completed payload. Returns {1 or 0 (whether the job was
-- still ours), then queue index (1-based) and payload when one was taken}.
local kept = redis.call('LREM', KEYS[1], 1, ARGV[1])
if kept == 1 then
  redis.call('INCR', KEYS[2])
end
for i = 3, #KEYS, 2 do
  local v = redis.call('LMOVE', KEYS[i], KEYS[i + 1], 'RIGHT', 'LEFT')
  if v then
    return {kept, (i - 1) / 2, v}
  end
end
return {kept}
