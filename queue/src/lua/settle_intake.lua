-- uses: guard.lua, now.lua, unique.lua, named.lua
-- Settles freshly fetched payloads that the fetch script left untouched or
-- that the worker read otherwise than the script's stamp.
-- KEYS: processing, scheduled, dead, stats:dead, unique, unique:expiry.
-- ARGV: quadruples of action, payload as held, payload to write, score:
-- `R` replaces the held payload with the stamped one,
-- `N` does the same for a held payload named by its length and SHA-1
--     (`<length>:<sha1 hex>`, named.lua) in place of its bytes, the
--     stamped one being it with the payload to write put after its
--     opening brace (a worker stamps a large payload so rather than send
--     it back whole, twice),
-- `S` parks the payload to write in the scheduled set at the score,
-- `D` dead-letters it with the envelope (the payload to write).
-- The score is an empty string for `R`; for `D` it is the unique key's
-- release token (unique.lua; '' for none).
-- Returns 1 or 0 per quadruple: whether the payload was still ours.
local processing, scheduled, dead, dead_total = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
expect(processing, 'list')
for i = 1, #ARGV, 4 do
  local action = ARGV[i]
  if action == 'S' then
    expect(scheduled, 'zset')
  elseif action == 'D' then
    expect(dead, 'list')
    expect_counter(dead_total)
    if ARGV[i + 3] ~= '' then
      expect(KEYS[5], 'hash')
      expect(KEYS[6], 'zset')
    end
  end
end
local out = {}
for i = 1, #ARGV, 4 do
  local action, held, write = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local ok, entry
  if action == 'N' then
    entry = named(processing, held)
    ok = entry and redis.call('LREM', processing, 1, entry) or 0
  else
    ok = redis.call('LREM', processing, 1, held)
  end
  if ok == 1 then
    if action == 'R' then
      redis.call('LPUSH', processing, write)
    elseif action == 'N' then
      redis.call('LPUSH', processing, '{' .. write .. string.sub(entry, 2))
    elseif action == 'S' then
      redis.call('ZADD', scheduled, tonumber(ARGV[i + 3]), write)
    else
      redis.call('LPUSH', dead, write)
      redis.call('INCR', dead_total)
      release(KEYS[5], KEYS[6], ARGV[i + 3])
    end
  end
  out[#out + 1] = ok
end
return out
