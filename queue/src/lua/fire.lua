-- uses: guard.lua, now.lua, outcome.lua, enqueue.lua as enqueue(KEYS, ARGV)
-- Claims one fire of a recurring schedule and enqueues its job in the same
-- step, so however many operators fire the schedule at once, and whatever
-- restarts in between, each fire is enqueued at most once. A schedule's
-- claims only move forward: a fire at or before the latest claimed one of
-- its schedule is refused.
-- Runs with now.lua and then enqueue.lua wrapped as
-- `local function enqueue(KEYS, ARGV) ... end` before it, so the job goes in
-- exactly as enqueue.lua puts it in (a held unique key refuses it).
-- KEYS: queue, scheduled, unique, unique:expiry, fires (hash: schedule ->
-- unix ms of its latest claimed fire).
-- ARGV: the schedule (`<namespace>/<pool>/<name>`); the fire time in unix
-- ms; the job's payload; its id (the payload's own `id`); its unique key
-- ('' for none); how long it holds the key, in milliseconds.
-- Returns {1, fire time}: claimed and enqueued; {0, fire time}: claimed,
-- and refused as a duplicate (a job holding its unique key is still
-- waiting, scheduled, retrying or running); {-1, latest}: not claimed,
-- this fire or a later one (at `latest`) was claimed before.
local fires = KEYS[5]
expect(fires, 'hash')
expect(KEYS[1], 'list')
expect(KEYS[2], 'zset')
expect(KEYS[3], 'hash')
expect(KEYS[4], 'zset')
local schedule, at = ARGV[1], tonumber(ARGV[2])
local latest = tonumber(redis.call('HGET', fires, schedule) or '-1')
if latest >= at then
  return {-1, latest}
end
redis.call('HSET', fires, schedule, ARGV[2])
local done = enqueue({KEYS[1], KEYS[2], KEYS[3], KEYS[4]},
  {ARGV[3], '', ARGV[4], ARGV[5], ARGV[6], '', ''})
return {done[1], at}
