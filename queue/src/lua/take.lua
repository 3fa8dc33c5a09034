-- take_jobs(waiting, processing, bucket, index, want, out, taken,
-- max_attempts, ids, interval, tolerance): the taking half shared by
-- fetch.lua and settle.lua (a function they start with, after clock.lua,
-- stamp.lua and rate.lua). Moves up to `want` jobs from the queue
-- `waiting` into `processing`, stamped (stamp.lua, with the ids after the
-- `taken` jobs this script took before), no more than the rate bucket
-- `bucket` allows (rate.lua; interval 0: no limit). When it takes any, it
-- appends to the flat reply `out` the group `index, count`, then the
-- payload as held and the stamp of each job. Returns how many it took and,
-- when the limit stopped it with jobs left in the queue and more wanted,
-- the ms until the next start is allowed (else nil).
local function take_jobs(waiting, processing, bucket, index, want, out, taken, max_attempts,
                         ids, interval, tolerance)
  local room, tat = want, 0
  if interval > 0 then
    room, tat = admissible(bucket, want, interval, tolerance)
  end
  local started = 0
  -- One RPOP for the whole batch and one LPUSH of every stamped payload:
  -- two commands per take instead of two per job. RPOP with a count hands
  -- the oldest first, and pushing them in that order leaves the newest at
  -- the head of the processing list, as a job-by-job move would. (A count
  -- of 1 still replies with an array; one slot takes the plain RPOP.)
  local popped
  if room == 1 then
    local v = redis.call('RPOP', waiting)
    popped = v and {v}
  elseif room > 1 then
    popped = redis.call('RPOP', waiting, room)
  end
  if popped then
    started = #popped
    local n = #out
    out[n + 1], out[n + 2] = index, started
    for j = 1, started do
      local held, how = stamp(popped[j], max_attempts, ids, taken + j - 1)
      popped[j] = held
      out[n + 2 * j + 1], out[n + 2 * j + 2] = held, how
    end
    for from = 1, started, 1000 do
      redis.call('LPUSH', processing, unpack(popped, from, math.min(from + 999, started)))
    end
  end
  if interval > 0 then
    local next_in = spend(bucket, tat, started, interval, tolerance)
    if started == room and started < want and redis.call('LLEN', waiting) > 0 then
      return started, next_in
    end
  end
  return started, nil
end
