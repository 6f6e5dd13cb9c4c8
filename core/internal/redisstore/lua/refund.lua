-- refund.lua: gives back up to n units of one key under every limit, units
-- recorded within the last window (Limiter.Refund, Rule.CountIf).
--
-- KEYS[i]  the storage key of limit i (one hash tag)
-- ARGV[1]  n, > 0; ARGV[2] now in µs, or 0 for the server's TIME
-- ARGV[3]  at: the time in µs the units were recorded, so that exactly
--          those go; 0 for the newest units
-- ARGV[4i] to ARGV[4i+3]  limit i: algorithm, count, window µs, precision µs
--
-- Returns the units given back under each limit.

return refund(KEYS, ARGV)
