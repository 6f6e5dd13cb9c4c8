-- reserve.lua: the throttler. Finds the earliest time at or after now plus
-- a lead when n units fit under every sliding-log limit of one key
-- (reservations made and a block counted) and records them at that time,
-- unless it is further away than the caller can wait.
--
-- KEYS     the key's block key, then each limit's log key
-- ARGV[1]  n, > 0; ARGV[2] now in µs, or 0 for the server's TIME
-- ARGV[3]  longest acceptable wait in µs, or -1 for no bound
-- ARGV[4]  the lead in µs, >= 0: the units' time is at least now plus it
-- ARGV[5]  the time of a reservation to give back first (a move), or 0
-- ARGV[2i+4], ARGV[2i+5]  limit i: count, window µs
--
-- Returns {reserved (1 or 0), wait µs (-1: never fits), then, when
-- reserved, the units' time in µs}, which release.lua takes back.

return reserve(KEYS, ARGV)
