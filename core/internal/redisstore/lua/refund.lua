-- refund.lua: gives back up to n units of one key under every limit, units
-- recorded within the last window, never going below empty (Limiter.Refund,
-- Rule.CountIf). See the *_refund functions in algorithms.lua.
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

return refund(KEYS, ARGV)
