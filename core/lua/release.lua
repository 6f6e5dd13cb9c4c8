-- release.lua: gives back a reservation made by reserve.lua whose caller
-- stopped waiting, so its slot is free again.
--
-- KEYS[i]  sliding-log key of limit i, as passed to reserve.lua
-- ARGV[1]  n: units per key
-- ARGV[2 .. 1 + n*#KEYS]  the members reserve.lua returned, key after key
--
-- Returns the number of members removed.

local n = tonumber(ARGV[1])
local removed = 0
for i, key in ipairs(KEYS) do
  for j = 1, n do
    removed = removed + redis.call('ZREM', key, ARGV[1 + (i - 1) * n + j])
  end
end
return removed
