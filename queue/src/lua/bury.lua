-- Dead-letters a job after a failed attempt and frees its unique key
-- (unique.lua). KEYS: processing, dead, stats:failed, stats:dead, unique,
-- unique:expiry. ARGV: payload, dead-letter envelope, the unique key's
-- release token ('' for none).
local processing, dead, failed, dead_total = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local payload, envelope = ARGV[1], ARGV[2]
expect(processing, 'list')
expect(dead, 'list')
expect_counter(failed)
expect_counter(dead_total)
if ARGV[3] ~= '' then
  expect(KEYS[5], 'hash')
  expect(KEYS[6], 'zset')
end
if redis.call('LREM', processing, 1, payload) == 1 then
  redis.call('LPUSH', dead, envelope)
  redis.call('INCR', failed)
  redis.call('INCR', dead_total)
  release(KEYS[5], KEYS[6], ARGV[3])
  return 1
end
return 0
