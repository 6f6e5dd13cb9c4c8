-- release.lua: gives back a reservation of reserve.lua whose caller stopped
-- waiting: n units at its time, under each limit.
--
-- KEYS[i]  sliding-log key of limit i, as passed to reserve.lua
-- ARGV[1]  n; ARGV[2] at, the reservation's time in µs; ARGV[3] now in µs,
--          or 0 for the server's TIME; ARGV[3+i] the window of limit i, µs
--
-- Returns the number of units removed.

return release(KEYS, ARGV)
