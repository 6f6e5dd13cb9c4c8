-- allow.lua: decides whether n units fit under every limit of one key and,
-- when they do and commit is set, records them under every limit: all or
-- none. A denied request changes nothing but dropping expired state.
-- Runs after algorithms.lua.
--
-- KEYS[i]  storage key of limit i; all keys share one hash tag
-- ARGV[1]  n: units asked, > 0
-- ARGV[2]  commit: 1 records the units when they fit, 0 only looks (Peek)
-- ARGV[3]  now in µs, or 0 to read the server's TIME
-- ARGV[4i], ARGV[4i+1], ARGV[4i+2], ARGV[4i+3]  limit i: algorithm
--          (0 log, 1 buckets, 2 counter), count, window µs, precision µs
--
-- Returns {allowed (1 or 0), then per limit: remaining, retry µs, reset µs}.
-- remaining counts after the units were recorded; retry is 0 for a limit
-- that admits, -1 for one that never can.

local n = tonumber(ARGV[1])
local commit = ARGV[2] == '1'
local now = now_us(ARGV[3])

local states, allowed = {}, true
for i, key in ipairs(KEYS) do
  local alg, count = ARGV[4 * i], tonumber(ARGV[4 * i + 1])
  local window, prec = tonumber(ARGV[4 * i + 2]), tonumber(ARGV[4 * i + 3])
  local s
  if alg == '0' then
    s = log_check(key, count, window, n, now)
  elseif alg == '1' then
    s = buckets_check(key, count, window, prec, n, now)
  else
    s = counter_check(key, count, window, n, now)
  end
  if s.retry ~= 0 then allowed = false end
  states[i] = s
end

local out = {allowed and 1 or 0}
for i, key in ipairs(KEYS) do
  local s = states[i]
  if allowed and commit then
    local alg, window = ARGV[4 * i], tonumber(ARGV[4 * i + 2])
    if alg == '0' then
      local _, reset = log_add(key, window, n, now, now, s)
      s.reset = reset
    elseif alg == '1' then
      s.reset = buckets_add(key, window, tonumber(ARGV[4 * i + 3]), n, now)
    else
      s.reset = counter_add(key, window, n, now)
    end
    s.free = s.free - n
  end
  out[#out + 1] = s.free
  out[#out + 1] = s.retry
  out[#out + 1] = s.reset
end
return out
