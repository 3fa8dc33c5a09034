-- `now` as text, made once per script rather than once per job.
local now_text = string.format('%d', now)

-- stamp(payload, max_attempts, id): the intake stamp, done as a job is
-- taken so that its handler can start without another round trip. Returns
-- the payload to hold in the processing list and how it was stamped:
--  -1  counted: the payload starts with `{"attempt":N,` (a retry, a job a
--      reaper returned, or a producer's own count) and now holds N + 1;
--   n  fresh: the n bytes after the opening brace were added
--      (`"attempt":1`, then `"id"` and `"enqueued_at"` when absent);
--   0  untouched: the worker decides (not an object, delayed with
--      `run_at`, out of attempts, or not stampable as text).
-- The payload's own bytes are never rewritten, so the worker can always
-- recover them exactly; it checks every stamped job again and takes the
-- untouched path itself when it disagrees. `id` is 32 hex digits made by
-- the caller; `now` comes from now.lua.
local function stamp(v, max_attempts, id)
  if string.byte(v, 1) ~= 123 or string.find(v, '"run_at"', 1, true) then
    return v, 0
  end
  local digits = string.match(v, '^{"attempt":(%d+),')
  if digits then
    local n = tonumber(digits)
    if #digits > 9 or string.byte(digits, 1) == 48 or n >= max_attempts then
      return v, 0
    end
    return '{"attempt":' .. (n + 1) .. ',' .. string.sub(v, #digits + 13), -1
  end
  if max_attempts < 1 then
    return v, 0
  end
  local has_id, has_enqueued
  local has_attempt = string.find(v, '"attempt"', 1, true)
  local names_id = string.find(v, '"id"', 1, true)
  if has_attempt or names_id or string.find(v, '"enqueued_at"', 1, true) then
    -- One of the names is somewhere in the payload. What workerpool's own
    -- producers write (the CLI, the library, schedules) ends with
    -- `"id":"…","enqueued_at":N}`: a field just before the closing brace
    -- is the object's own, and so, with no `attempt` and `id` named, both
    -- are taken as present. Taking a field as present is safe either way: the worker
    -- checks the stamped job and takes the untouched path when one is not.
    local e = names_id and not has_attempt and string.find(v, '","enqueued_at":', math.max(1, #v - 40), true)
    if e and string.find(v, '^%d+}$', e + 16) then
      return '{"attempt":1,' .. string.sub(v, 2), 12
    end
    -- Else read the object's own fields (a small payload only; a large one
    -- is the worker's to parse).
    if #v > 4096 then
      return v, 0
    end
    local ok, fields = pcall(cjson.decode, v)
    if not ok or type(fields) ~= 'table' or fields.attempt ~= nil then
      return v, 0
    end
    has_id, has_enqueued = fields.id ~= nil, fields.enqueued_at ~= nil
  end
  local add
  if not has_id and not has_enqueued then
    -- The common case in one concatenation.
    add = '"attempt":1,"id":"' .. id .. '","enqueued_at":' .. now_text
  else
    add = '"attempt":1'
    if not has_id then
      add = add .. ',"id":"' .. id .. '"'
    end
    if not has_enqueued then
      add = add .. ',"enqueued_at":' .. now_text
    end
  end
  local rest = string.sub(v, 2)
  if string.find(rest, '^%s*}') then
    return '{' .. add .. rest, #add
  end
  return '{' .. add .. ',' .. rest, #add + 1
end
