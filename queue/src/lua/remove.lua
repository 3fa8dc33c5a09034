-- uses: guard.lua, now.lua
-- Removes the given entries from a list. KEYS: the list. ARGV: entries
-- as stored. Returns how many were removed.
local list = KEYS[1]
expect(list, 'list')
local n = 0
for i = 1, #ARGV do
  n = n + redis.call('LREM', list, 1, ARGV[i])
end
return n
