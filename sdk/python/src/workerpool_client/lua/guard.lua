-- expect(key, want): stops the script with an error that names `key`
-- unless the key holds a `want` ('list', 'zset', 'hash' or 'string') or
-- does not exist. Every script that writes calls it for each key it may
-- write (or read with a typed command) before its first write: Redis does
-- not undo a script's writes when a later command fails, so a job removed
-- from one key and refused by the next (WRONGTYPE) would be in none. A
-- script stopped here has changed nothing. Each key is asked once a run.
local checked = {}
local type_names = {list = 'a list', zset = 'a sorted set', hash = 'a hash',
  string = 'a string', set = 'a set', stream = 'a stream'}
local function expect(key, want)
  if checked[key] then
    return
  end
  local t = redis.call('TYPE', key)
  t = type(t) == 'table' and t.ok or t
  if t ~= want and t ~= 'none' then
    error({err = 'WRONGTYPE key ' .. key .. ' holds ' .. (type_names[t] or t) .. ' where the queue '
      .. 'contract keeps ' .. type_names[want] .. '; nothing was changed. Another program '
      .. 'wrote this key: rename or remove it'})
  end
  checked[key] = true
end

-- expect_counter(key): as expect(key, 'string'), and the value, when there
-- is one, is an integer INCR can add to. A counter written by another
-- program ('abc', '1.5') would otherwise stop a script at its INCR, after
-- it had moved jobs: checked here, before the first write, it stops the
-- script having changed nothing.
local counters = {}
local function expect_counter(key)
  if counters[key] then
    return
  end
  expect(key, 'string')
  local v = redis.call('GET', key)
  if v and not string.match(v, '^%-?%d+$') then
    error({err = 'WRONGTYPE key ' .. key .. ' holds ' .. string.format('%q', string.sub(v, 1, 40))
      .. ' where the queue contract keeps an integer counter; nothing was changed. Another '
      .. 'program wrote this key: rename or remove it'})
  end
  counters[key] = true
end
