-- uses: guard.lua, now.lua
-- Moves dead letters back onto the queue for a fresh start. KEYS: dead,
-- queue. ARGV: pairs of the dead-letter entry as stored and the payload to
-- push. An entry is moved only if it is still in the dead list, so two
-- operators retrying at once move each job once. The entries come from
-- the list's oldest end, so each is looked for from there. Returns how
-- many moved.
local dead, queue = KEYS[1], KEYS[2]
expect(dead, 'list')
expect(queue, 'list')
-- ARGV: pairs of the entry as stored, payload to push.
local n = 0
for i = 1, #ARGV, 2 do
  if redis.call('LREM', dead, '-1', ARGV[i]) == 1 then
    redis.call('LPUSH', queue, ARGV[i + 1])
    n = n + 1
  end
end
return n
