-- reset.lua: forgets every unit counted for one key under the given limits,
-- lifts the key's block and forgets the denials counted for its penalty.
--
-- KEYS  the key's block key, its penalty key and the storage keys of the
--       limits; all keys share one hash tag
-- ARGV  none
--
-- Returns the number of keys deleted.

local deleted = 0
for i = 1, #KEYS, 1000 do -- in chunks: unpack takes a few thousand values at most
  deleted = deleted + redis.call('DEL', unpack(KEYS, i, math.min(i + 999, #KEYS)))
end
return deleted
