-- reserve.lua: the throttler. Finds the earliest time at or after now when
-- n units fit under every sliding-log limit of one key, counting the
-- reservations already made and any block of the key (placed after it),
-- and records the units at that time in the same call, unless that time is
-- further away than the caller can wait.
--
-- KEYS[1]    the key's block key (see Limiter.Block)
-- KEYS[i+1]  sliding-log key of limit i; all keys share one hash tag
-- ARGV[1]  n: units asked, > 0
-- ARGV[2]  now in µs, or 0 to read the server's TIME
-- ARGV[3]  longest acceptable wait in µs, or -1 for no bound
-- ARGV[2i+2], ARGV[2i+3]  limit i: count, window µs
--
-- Returns {reserved (1 or 0), wait µs (-1: never fits), then, when
-- reserved, the units' time in µs}: release.lua takes it back.

return reserve(KEYS, ARGV)
