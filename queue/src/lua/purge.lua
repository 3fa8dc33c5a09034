-- uses: guard.lua, now.lua
-- Removes a whole list in one step (UNLINK: its memory is freed in the
-- background, so a long list does not stall the server). KEYS: the list.
-- Returns how many entries it had.
expect(KEYS[1], 'list')
local n = redis.call('LLEN', KEYS[1])
redis.call('UNLINK', KEYS[1])
return n
