-- too_large(v, dead, dead_total, max_bytes, worker): dead-letters the
-- payload `v`, longer than `max_bytes`, with the reason `too_large`, kept
-- whole and byte for byte: the entry is the envelope's fields, then
-- `"job":`, the payload exactly as it was taken and a closing brace, so
-- the payload is the entry's last `size` bytes before that brace (and the
-- entry is JSON whenever the payload is). The error gives the size and
-- the payload's start, escaped (every byte outside printable ASCII as
-- \xNN) and bounded. Returns the error. The payload never reaches the
-- worker; its unique key, if it has one, is held until its hold runs out.
local function too_large(v, dead, dead_total, max_bytes, worker)
  local size = #v
  local start = string.gsub(string.sub(v, 1, 80), '[%z\1-\31"\\\127-\255]', function(c)
    if c == '"' or c == '\\' then
      return '\\' .. c
    end
    return string.format('\\x%02x', string.byte(c))
  end)
  local message = 'payload of ' .. size .. ' bytes is over the limit of ' .. max_bytes
    .. ' bytes (--max-payload-bytes); it starts: "' .. start .. (size > 80 and '…' or '') .. '"'
  local attempts = tonumber(string.match(v, '^{"attempt":(%d%d?%d?%d?%d?%d?%d?%d?%d?),') or '0')
  -- The message's own escapes: it is put into JSON as a string.
  local json_error = string.gsub(message, '[\\"]', '\\%0')
  redis.call('LPUSH', dead, '{"reason":"too_large","error":"' .. json_error .. '","attempts":'
    .. string.format('%d', attempts) .. ',"died_at":' .. string.format('%d', now()) .. ',"worker":' .. cjson.encode(worker)
    .. ',"size":' .. size .. ',"encoding":"raw","job":' .. v .. '}')
  redis.call('INCR', dead_total)
  return message
end

-- kept_of(held, keep_ms): the id, attempt and how long to keep (ms) of
-- the job `held` (as stamped) when it keeps its outcome: its own `keep`
-- (seconds), else `keep_ms` (the worker's --keep-outcomes, 0: none), as
-- the worker reads them. nil when it keeps none, or when only the worker
-- can tell (a `keep` that is not a positive number, which the worker
-- warns of; an object too large to read here; an id not a string).
local function kept_of(held, keep_ms)
  local fields
  local function read()
    if not fields then
      if #held > 4096 then
        return nil
      end
      local ok, f = pcall(cjson.decode, held)
      if not ok or type(f) ~= 'table' then
        return nil
      end
      fields = f
    end
    return fields
  end
  local keep = keep_ms
  -- workerpool's producers write a job's own fields, `keep` among them,
  -- before the id and enqueued_at it ends with: there, `keep` (whole
  -- seconds) is the object's own, read without decoding it.
  local secs, tail_id = match(held, ',"keep":(%d%d?%d?%d?%d?%d?%d?),"id":"([^"\\]+)","enqueued_at":%d+}$')
  if secs and byte(secs, 1) ~= 48 then
    local attempt = match(held, '^{"attempt":(%d+),')
    if not attempt then
      return nil
    end
    return tail_id, attempt, math.min(tonumber(secs) * 1000, MAX_KEEP_MS)
  end
  if find(held, 'keep"', 1, true) then
    local f = read()
    if not f then
      return nil
    end
    local own = f.keep
    if own ~= nil then
      if type(own) ~= 'number' or own ~= own or own <= 0 or own == math.huge then
        return nil
      end
      -- As the worker's Duration: to the nanosecond, then whole ms.
      own = math.min(own, MAX_KEEP_MS / 1000)
      keep = math.max(1, math.floor(math.floor(own * 1e9 + 0.5) / 1e6))
    end
  end
  if keep <= 0 then
    return nil
  end
  -- The stamp put `attempt` first, and a fresh job's id after it; a job
  -- from workerpool's producers ends with its id and enqueued_at.
  local attempt, id = match(held, '^{"attempt":(%d+),"id":"([^"\\]+)"')
  if not id then
    attempt = match(held, '^{"attempt":(%d+),')
    id = match(held, ',"id":"([^"\\]+)","enqueued_at":%d+}$')
    if not id then
      local f = read()
      id = f and f.id
      if type(id) ~= 'string' then
        return nil
      end
    end
  end
  if not attempt then
    return nil
  end
  return id, attempt, keep
end

-- take_jobs(waiting, processing, bucket, dead, dead_total, index, want,
-- out, taken, max_attempts, ids, interval, tolerance, max_bytes, worker,
-- keep_ms):
-- the taking half shared by fetch.lua and settle.lua (a function they
-- start with, after clock.lua, stamp.lua, rate.lua and outcome.lua). Moves
-- up to `want`
-- jobs from the queue `waiting` into `processing`, stamped (stamp.lua,
-- with the ids after the `taken` jobs this script took before), no more
-- than the rate bucket `bucket` allows (rate.lua; interval 0: no limit).
-- A payload longer than `max_bytes` (0: no limit) goes to the dead list
-- `dead` instead (too_large()), counted in `dead_total`. A stamped job
-- that keeps its outcome (kept_of(), with `keep_ms` the worker's default)
-- starts as it is taken: outcome_run() writes it `running`, or finds it
-- cancelled, and the worker need not ask. When it takes
-- any, it appends to the flat reply `out` the group `index, count,
-- marks`, then the payload as held and the stamp of each job; a
-- dead-lettered one has its error in place of the payload and the stamp
-- -2. `marks` is '' when no job of the group keeps its outcome, else one
-- letter per job: `R` written running, `C` cancelled (not to run), `-`
-- neither (the worker decides). Returns how many it
-- took (dead-lettered ones included) and, when the limit stopped it with
-- jobs left in the queue and more wanted, the ms until the next start is
-- allowed (else nil).
local function take_jobs(waiting, processing, bucket, dead, dead_total, index, want, out, taken,
                         max_attempts, ids, interval, tolerance, max_bytes, worker, keep_ms)
  local room, tat = want, 0
  if interval > 0 then
    room, tat = admissible(bucket, want, interval, tolerance)
  end
  local started, refused = 0, 0
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
    out[n + 1], out[n + 2], out[n + 3] = index, started, ''
    local marks
    for j = 1, started do
      local v = popped[j]
      local at = n + 2 * j + 2
      if max_bytes > 0 and #v > max_bytes then
        out[at], out[at + 1] = too_large(v, dead, dead_total, max_bytes, worker), -2
        refused = refused + 1
      else
        local held, how = stamp(v, max_attempts, ids, taken + j - 1)
        popped[j - refused] = held
        out[at], out[at + 1] = held, how
        -- `keep"`, not `"keep"`: a quote is the commonest byte of JSON,
        -- and each one the search meets costs it a comparison (stamp.lua).
        if how ~= 0 and (keep_ms > 0 or find(held, 'keep"', 1, true)) then
          marks = marks or {}
          marks[j] = held
        end
      end
    end
    local held_n = started - refused
    for from = 1, held_n, 1000 do
      redis.call('LPUSH', processing, unpack(popped, from, math.min(from + 999, held_n)))
    end
    -- The outcomes after the jobs are held: should a write fail, the jobs
    -- are in the processing list (where the reaper finds them), not lost.
    if marks then
      for j = 1, started do
        local held, mark = marks[j], nil
        if held then
          local id, attempt, keep = kept_of(held, keep_ms)
          if id then
            local hash = waiting .. ':job:' .. id
            mark = outcome_run(hash, hash .. ':end', now(), attempt, worker, keep)
          end
        end
        marks[j] = mark or '-'
      end
      out[n + 3] = table.concat(marks)
    end
  end
  if interval > 0 then
    -- A job dead-lettered for its size never started: it spends nothing.
    local next_in = spend(bucket, tat, started - refused, interval, tolerance)
    if started == room and started < want and redis.call('LLEN', waiting) > 0 then
      return started, next_in
    end
  end
  return started, nil
end
