-- refund.lua: gives back up to n units of one key under every limit, units
-- recorded within the last window, never going below empty (Limiter.Refund,
-- Rule.CountIf). Runs after algorithms.lua (see the *_refund functions).
--
-- KEYS[i]  the storage key of limit i; all keys share one hash tag
-- ARGV[1]  n: units to give back, > 0
-- ARGV[2]  now in µs, or 0 to read the server's TIME
-- ARGV[3]  at: the time in µs the units were recorded, so that exactly
--          those go; 0 for the newest units
-- ARGV[4i], ARGV[4i+1], ARGV[4i+2], ARGV[4i+3]  limit i: algorithm
--          (0 log, 1 buckets, 2 counter), count, window µs, precision µs
--
-- Returns the units given back under each limit.

local n, now, at = tonumber(ARGV[1]), now_us(ARGV[2]), tonumber(ARGV[3])
local out = {}
for i, key in ipairs(KEYS) do
  local alg, count = ARGV[4 * i], tonumber(ARGV[4 * i + 1])
  local window, prec = tonumber(ARGV[4 * i + 2]), tonumber(ARGV[4 * i + 3])
  if alg == '0' then
    out[i] = log_refund(key, window, n, now, at)
  elseif alg == '1' then
    out[i] = buckets_refund(key, window, prec, n, now, at)
  else
    out[i] = counter_refund(key, count, window, n, now, at)
  end
end
return out
