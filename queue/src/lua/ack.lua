-- Completes a job and frees its unique key (unique.lua). KEYS:
-- processing, stats:processed, unique, unique:expiry. ARGV: payload, the
-- unique key's release token ('' for none).
local processing, processed, unique, expiry = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local payload = ARGV[1]
expect(processing, 'list')
expect_counter(processed)
if ARGV[2] ~= '' then
  expect(unique, 'hash')
  expect(expiry, 'zset')
end
if redis.call('LREM', processing, 1, payload) == 1 then
  redis.call('INCR', processed)
  release(unique, expiry, ARGV[2])
  return 1
end
return 0
