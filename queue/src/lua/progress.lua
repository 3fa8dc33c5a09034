-- uses: guard.lua, now.lua
-- A running kept job reports how far it has got. KEYS: its outcome hash.
-- ARGV: the worker instance, the attempt, the progress (JSON text).
-- Written only while the outcome says this attempt runs on this worker: a
-- late report from an attempt that ended, or from a worker whose job was
-- returned to the queue, changes nothing.
-- Returns {written (1 or 0), cancellation asked for (1 or 0)}: a report
-- is also how the worker learns of a cancel soon.
local hash = KEYS[1]
expect(hash, 'hash')
local state = redis.call('HMGET', hash, 'state', 'worker', 'attempt', 'cancel_requested')
local asked = state[4] and 1 or 0
if state[1] ~= 'running' or state[2] ~= ARGV[1] or state[3] ~= ARGV[2] then
  return {0, asked}
end
redis.call('HSET', hash, 'progress', ARGV[3], 'progress_at', now)
return {1, asked}
