-- uses: guard.lua, now.lua, unique.lua, named.lua, outcome.lua
-- Settles freshly fetched payloads that the fetch script left untouched or
-- that the worker read otherwise than the script's stamp.
-- KEYS: processing, scheduled, dead, stats:dead, unique, unique:expiry;
-- then, for each action whose job keeps its outcome, its outcome hash and
-- end stream.
-- ARGV: six per action: action, payload as held, payload to write, score,
-- then the position in KEYS of the job's outcome hash ('' for none; the
-- end stream follows it) and how long to keep a final outcome in ms:
-- `R` replaces the held payload with the stamped one,
-- `N` does the same for a held payload named by its length and SHA-1
--     (`<length>:<sha1 hex>`, named.lua) in place of its bytes, the
--     stamped one being it with the payload to write put after its
--     opening brace (a worker stamps a large payload so rather than send
--     it back whole, twice),
-- `S` parks the payload to write in the scheduled set at the score,
-- `D` dead-letters it with the envelope (the payload to write).
-- A kept `S` is written `scheduled` (due at the score), a kept `D` `dead`
-- with the envelope's `error`.
-- The score is an empty string for `R`; for `D` it is the unique key's
-- release token (unique.lua; '' for none).
-- Returns 1 or 0 per quadruple: whether the payload was still ours.
local processing, scheduled, dead, dead_total = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
expect(processing, 'list')
local SIX = 6
for i = 1, #ARGV, SIX do
  local at = tonumber(ARGV[i + 4])
  if at and at > 0 then
    expect(KEYS[at], 'hash')
    expect(KEYS[at + 1], 'stream')
  end
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
for i = 1, #ARGV, SIX do
  local action, held, write = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local at = tonumber(ARGV[i + 4])
  local kept = at and at > 0 and (action == 'S' or action == 'D')
  local ok, entry = 0, nil
  if action == 'N' then
    entry = named(processing, held)
  elseif not kept or redis.call('LPOS', processing, held) then
    entry = held
  end
  -- A kept outcome is written while the job is still held, as the settle
  -- script does: a user the ACL refuses the write stops the script with
  -- the job in the processing list, not moved and unsaid.
  if entry and kept then
    local hash, ending = KEYS[at], KEYS[at + 1]
    if action == 'S' then
      outcome_open(hash, ending, 'scheduled', now, ARGV[i + 3])
    else
      local ok_letter, letter = pcall(cjson.decode, write)
      local set
      if ok_letter and type(letter) == 'table' and type(letter.error) == 'string' then
        set = {'error', letter.error}
      end
      outcome_end(hash, ending, 'dead', now, ARGV[i + 5], set, {'result', 'result_error'})
    end
  end
  if entry then
    ok = redis.call('LREM', processing, 1, entry)
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
