-- Completes a job. KEYS: processing, stats:processed. ARGV: payload.
local processing, processed = KEYS[1], KEYS[2]
local payload = ARGV[1]
if redis.call('LREM', processing, 1, payload) == 1 then
  redis.call('INCR', processed)
  return 1
end
return 0
