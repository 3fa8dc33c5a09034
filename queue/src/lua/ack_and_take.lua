-- Completes a job and, in the same round trip, takes the next one into
-- the freed slot. KEYS: processing and stats:processed of the completed
-- job's queue, then pairs of queue and processing list, highest priority
-- first. ARGV: the completed payload. Returns {1 or 0 (whether the job was
-- still ours), then queue index (1-based) and payload when one was taken}.
local processing, processed = KEYS[1], KEYS[2]
local payload = ARGV[1]
-- KEYS[3..]: pairs of queue and processing list, highest priority first.
local kept = redis.call('LREM', processing, 1, payload)
if kept == 1 then
  redis.call('INCR', processed)
end
for i = 3, #KEYS, 2 do
  local v = redis.call('LMOVE', KEYS[i], KEYS[i + 1], 'RIGHT', 'LEFT')
  if v then
    return {kept, (i - 1) / 2, v}
  end
end
return {kept}
