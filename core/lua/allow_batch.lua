-- allow_batch.lua: many allow.lua decisions, of any keys, in one script
-- call: the batcher sends the queued decisions of one process this way to a
-- single Redis server (never to a Cluster, where the keys of different
-- decisions live on different nodes). Each decision is atomic on its own,
-- exactly as allow.lua; the server's TIME is read once for all of them.
-- Runs after algorithms.lua (see decide there).
--
-- KEYS     the keys of every decision, decision after decision, as
--          allow.lua's KEYS
-- ARGV[1]  the number of decisions
-- then per decision: its number of keys k, followed by the values
--          allow.lua takes as ARGV (n, commit, now, the penalty's three,
--          then 4 per limit)
--
-- Returns one entry per decision: allow.lua's reply, or an error reply when
-- that decision failed (such as WRONGTYPE on a key that is not ours); the
-- other decisions are unaffected.

local out, key, at = {}, 1, 2
local server_now -- read at most once
for d = 1, tonumber(ARGV[1]) do
  local k = tonumber(ARGV[at])
  local now = tonumber(ARGV[at + 3])
  if not now or now <= 0 then
    if not server_now then server_now = now_us(0) end
    now = server_now
  end
  local ok, reply = pcall(decide, KEYS, key, k, ARGV, at + 1, now)
  if ok then
    out[d] = reply
  elseif type(reply) == 'table' and reply.err then
    out[d] = reply -- redis.call's error: becomes this entry's error reply
  else
    out[d] = redis.error_reply(tostring(reply))
  end
  local limits = k - 1 -- keys but the block key and the penalty key
  if tonumber(ARGV[at + 4]) > 0 then limits = k - 2 end
  key = key + k
  at = at + 7 + 4 * limits
end
return out
