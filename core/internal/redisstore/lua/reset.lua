-- reset.lua: forgets the units of one key under the given limits, lifts its
-- block and forgets its penalty's denials.
--
-- KEYS  the key's block and penalty keys and its limits' keys (one hash tag)
--
-- Returns the number of keys deleted.

local deleted = 0
for i = 1, #KEYS, 1000 do -- in chunks: unpack takes a few thousand values at most
  deleted = deleted + redis.call('DEL', unpack(KEYS, i, math.min(i + 999, #KEYS)))
end
return deleted
