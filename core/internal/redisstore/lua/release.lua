-- release.lua: gives back a reservation made by reserve.lua whose caller
-- stopped waiting, so its slot is free again. Units of one time are alike:
-- any n of them at the reservation's time go. See log_remove.
--
-- KEYS[i]  sliding-log key of limit i, as passed to reserve.lua
-- ARGV[1]  n: units per key
-- ARGV[2]  at: the reservation's time in µs, as reserve.lua returned it
-- ARGV[3]  now in µs, or 0 to read the server's TIME
-- ARGV[3+i]  the window of limit i in µs
--
-- Returns the number of units removed.

return release(KEYS, ARGV)
