-- allow_batch.lua: many allow.lua decisions, of any keys, in one script
-- call: the batcher sends the queued decisions of one process this way to a
-- single Redis server (never to a Cluster, where the keys of different
-- decisions live on different nodes). Each decision is atomic on its own,
-- exactly as allow.lua; the server's TIME is read once for all of them.
-- Decisions that ask alike (commit, penalty and limits) share one spec,
-- sent and read once. Decisions one after another that ask the same of
-- the same keys (a hot key's) are answered together, by one check and one
-- add (see decide), with the answers they would have had one by one. Runs
-- after algorithms.lua (see read_specs and decide there).
--
-- KEYS     the keys of every decision, decision after decision, as
--          allow.lua's KEYS
-- ARGV[1]  the number of decisions
-- ARGV[2]  the number of specs
-- then     each spec: allow.lua's ARGV[1]
-- then     per decision: its spec (from 1), n, now (0: the server's TIME)
--
-- Returns the values of allow.lua's replies, decision after decision, in
-- one flat array (no array per decision: fewer tables, a shorter reply).
-- A decision that failed (such as WRONGTYPE on a key that is not ours)
-- answers -1 as allowed and zeros for the rest, so that every value is an
-- integer (the batcher reads the reply as such, nothing boxed) and sends
-- the decision again alone, for Redis's error; the other decisions are
-- unaffected (but those of its run, which fail alike).

local specs, at = read_specs(ARGV)

local out, o, key = {}, 0, 1
local server_now -- read at most once
local d, decisions = 1, tonumber(ARGV[1])
while d <= decisions do
  local si, sn, snow = ARGV[at], ARGV[at + 1], ARGV[at + 2]
  local spec, n, now = specs[tonumber(si)], tonumber(sn), tonumber(snow)
  if not now or now <= 0 then
    if not server_now then server_now = now_us(0) end
    now = server_now
  end
  local nkeys = 1 + #spec.limits -- the block key, the limits' keys
  if spec.denials > 0 then nkeys = nkeys + 1 end -- and the penalty key
  -- the run: this decision and those right after it that ask the same of
  -- the same keys (a hot key's), which decide answers together
  local runs = 1
  if spec.commit and spec.denials == 0 and n >= 1 then
    while d + runs <= decisions do
      local a, k = at + 3 * runs, key + nkeys * runs
      if ARGV[a] ~= si or ARGV[a + 1] ~= sn or ARGV[a + 2] ~= snow then break end
      local same = true
      for i = 0, nkeys - 1 do
        if KEYS[k + i] ~= KEYS[key + i] then same = false break end
      end
      if not same then break end
      runs = runs + 1
    end
  end
  local size, left = 3 + 3 * #spec.limits, runs
  while left > 0 do
    local ok, last, answered = pcall(decide, KEYS, key, n, now, spec, out, o, left)
    if ok then
      o, left = last, left - answered
    else -- failed: -1 (see the reply above); a key of another type fails
      -- as it is read, before anything is recorded
      for _ = 1, left do
        out[o + 1] = -1
        for i = o + 2, o + size do out[i] = 0 end
        o = o + size
      end
      left = 0
    end
  end
  key, at, d = key + nkeys * runs, at + 3 * runs, d + runs
end
return out
