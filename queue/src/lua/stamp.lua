-- Locals for the string functions the stamp calls for every job taken
-- (a global lookup per call costs Redis as much as a short search), and
-- `now` as text, made once per script rather than once per job.
local byte, find, sub, match = string.byte, string.find, string.sub, string.match
local now_text = string.format('%d', now)

-- stamp(payload, max_attempts, ids, k): the intake stamp, done as a job is
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
-- untouched path itself when it disagrees. A fresh job without an id gets
-- the k-th (0-based) of the 32-hex-digit ids in `ids`, made by the caller;
-- `now` comes from now.lua.
--
-- The searches look for a name with its closing quote but not its opening
-- one (`run_at"`): the opening quote is the commonest byte of a JSON
-- text, and each of its matches costs a comparison. A longer name that
-- ends the same way only sends the job down the slower, exact path.
local function stamp(v, max_attempts, ids, k)
  if byte(v, 1) ~= 123 or find(v, 'run_at"', 1, true) then
    return v, 0
  end
  if byte(v, 3) == 97 then -- `{"a`: perhaps a leading attempt
    local digits = match(v, '^{"attempt":(%d+),')
    if digits then
      local n = tonumber(digits)
      if #digits > 9 or byte(digits, 1) == 48 or n >= max_attempts then
        return v, 0
      end
      return '{"attempt":' .. (n + 1) .. ',' .. sub(v, #digits + 13), -1
    end
  end
  if max_attempts < 1 then
    return v, 0
  end
  local has_attempt = find(v, 'attempt"', 1, true)
  if not has_attempt then
    -- What workerpool's own producers write (the CLI, the library,
    -- schedules) ends with `,"id":"<32 hex digits>","enqueued_at":N}`:
    -- fields just before the object's closing brace are its own.
    local e = find(v, '","enqueued_at":', #v > 64 and #v - 64 or 1, true)
    if e and e > 39 and find(v, '^%d+}$', e + 16) and find(v, '^,"id":"', e - 39) then
      return '{"attempt":1,' .. sub(v, 2), 12
    end
  end
  local has_id, has_enqueued
  if has_attempt or find(v, 'id"', 1, true) or find(v, 'enqueued_at"', 1, true) then
    -- One of the names is somewhere in the payload: read the object's own
    -- fields (a small payload only; a large one is the worker's to parse).
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
    add = '"attempt":1,"id":"' .. sub(ids, 32 * k + 1, 32 * k + 32) .. '","enqueued_at":' .. now_text
  else
    add = '"attempt":1'
    if not has_id then
      add = add .. ',"id":"' .. sub(ids, 32 * k + 1, 32 * k + 32) .. '"'
    end
    if not has_enqueued then
      add = add .. ',"enqueued_at":' .. now_text
    end
  end
  if find(v, '^%s*}', 2) then
    return '{' .. add .. sub(v, 2), #add
  end
  return '{' .. add .. ',' .. sub(v, 2), #add + 1
end
