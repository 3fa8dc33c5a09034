-- uses: guard.lua, now.lua, outcome.lua
-- Puts jobs back at the head of the queue (they run next). KEYS:
-- processing, queue, then the outcome hash of each job that keeps one.
-- ARGV: the instance, why (the end of the outcome's error: 'as it
-- stopped'), then triples of payload as held, payload to push,
-- and the position in KEYS of its outcome hash ('' for none): a kept job
-- still shown running on this instance is written `waiting`.
-- Triples are pushed in order, so the last ends up at the very head.
-- Returns how many were still ours.
local processing, queue = KEYS[1], KEYS[2]
local instance, why = ARGV[1], ARGV[2]
expect(processing, 'list')
expect(queue, 'list')
for k = 3, #KEYS do
  expect(KEYS[k], 'hash')
end
local n = 0
for i = 3, #ARGV, 3 do
  if redis.call('LREM', processing, 1, ARGV[i]) == 1 then
    redis.call('RPUSH', queue, ARGV[i + 1])
    n = n + 1
    local at = tonumber(ARGV[i + 2])
    if at and at > 0 then
      outcome_back(KEYS[at], instance, now, 'given back by its worker ' .. instance .. ' ' .. why)
    end
  end
end
return n
