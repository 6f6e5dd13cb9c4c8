-- allow_batch.lua: many allow.lua decisions, of any keys, in one script
-- call: the batcher sends the queued decisions of one process this way to a
-- single Redis server (never to a Cluster, where the keys of different
-- decisions live on different nodes). Each decision is atomic on its own,
-- exactly as allow.lua; the server's TIME is read once for all of them.
-- Decisions that ask alike (commit, penalty and limits) share one spec,
-- sent and read once. Runs after algorithms.lua (see read_spec and decide
-- there).
--
-- KEYS     the keys of every decision, decision after decision, as
--          allow.lua's KEYS
-- ARGV[1]  the number of decisions
-- ARGV[2]  the number of specs
-- then per spec: the number of its values, then the values (commit,
--          the penalty's three, then 4 per limit: allow.lua's ARGV[3] on)
-- then per decision: its spec (from 1), n, now (0: the server's TIME)
--
-- Returns the values of allow.lua's replies, decision after decision, in
-- one flat array (no array per decision: fewer tables, a shorter reply).
-- A decision that failed (such as WRONGTYPE on a key that is not ours) has
-- an error reply as its first value and zeros for the rest; the other
-- decisions are unaffected.

local specs, at = {}, 3
for i = 1, tonumber(ARGV[2]) do
  local m = tonumber(ARGV[at])
  specs[i] = read_spec(ARGV, at + 1, (m - 4) / 4)
  at = at + 1 + m
end

local out, o, key = {}, 0, 1
local server_now -- read at most once
for d = 1, tonumber(ARGV[1]) do
  local spec, n, now = specs[tonumber(ARGV[at])], tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  if not now or now <= 0 then
    if not server_now then server_now = now_us(0) end
    now = server_now
  end
  local size = 3 + 3 * #spec.limits
  local ok, err = pcall(decide, KEYS, key, n, now, spec, out, o)
  if not ok then
    if type(err) == 'table' and err.err then
      out[o + 1] = err -- redis.call's error: becomes this entry's error reply
    else
      out[o + 1] = redis.error_reply(tostring(err))
    end
    for i = o + 2, o + size do out[i] = 0 end
  end
  o = o + size
  key = key + 1 + #spec.limits -- the block key, the limits' keys
  if spec.denials > 0 then key = key + 1 end -- and the penalty key
  at = at + 3
end
return out
