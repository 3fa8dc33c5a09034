-- Completes a job. KEYS: processing, stats:processed. ARGV: payload.
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
  redis.call('INCR', KEYS[2])
  return 1
end
return 0
