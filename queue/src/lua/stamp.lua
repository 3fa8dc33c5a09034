-- Locals for the string functions the stamp calls for every job taken
-- (a global lookup per call costs Redis as much as a short search), and
-- `now` as text, made once per script (when a job needs it) rather than
-- once per job.
local byte, find, sub, match = string.byte, string.find, string.sub, string.match
local now_text

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
-- `now()` comes from clock.lua.
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
  local enqueued = find(v, 'enqueued_at"', 1, true)
  -- What workerpool's own producers write (the CLI, the library,
  -- schedules) ends with `,"id":"<32 hex digits>","enqueued_at":N}`:
  -- fields just before the object's closing brace are its own.
  if enqueued and not has_attempt and enqueued > 42
      and find(v, '^","enqueued_at":%d+}$', enqueued - 3) and find(v, '^,"id":"', enqueued - 42) then
    return '{"attempt":1,' .. sub(v, 2), 12
  end
  local has_id, has_enqueued
  if has_attempt or enqueued or find(v, 'id"', 1, true) then
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
  if not has_enqueued and not now_text then
    now_text = string.format('%d', now())
  end
  -- A comma after the added fields unless the object is empty; the bytes
  -- added are what the held payload has beyond the pushed one.
  local comma = find(v, '^%s*}', 2) and '' or ','
  local held
  if not has_id and not has_enqueued then
    -- The common case in one concatenation.
    held = '{"attempt":1,"id":"' .. sub(ids, 32 * k + 1, 32 * k + 32) .. '","enqueued_at":'
      .. now_text .. comma .. sub(v, 2)
  elseif not has_id then
    held = '{"attempt":1,"id":"' .. sub(ids, 32 * k + 1, 32 * k + 32) .. '"' .. comma .. sub(v, 2)
  elseif not has_enqueued then
    held = '{"attempt":1,"enqueued_at":' .. now_text .. comma .. sub(v, 2)
  else
    held = '{"attempt":1' .. comma .. sub(v, 2)
  end
  return held, #held - #v
end
