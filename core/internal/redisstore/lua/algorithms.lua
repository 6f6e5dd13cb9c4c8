-- algorithms.lua: the sliding-window algorithms, the decision over several
-- limits built on them, and the functions the scripts call (the Store's table
-- in redisstore.go lists them). Times are µs since the epoch, exact in doubles
-- up to 2^53; numbers go to redis.call as numbers or '%d', never tostring or '..'.
--
-- A check returns the state of one limit as values (no table): free (units
-- that fit now, >= 0), retry (µs until n more fit: 0 now, -1 never), reset
-- (µs until the limit is back to its full Count), then what its add needs.
-- An add records n units, sets the key's TTL and returns the new reset.
--
-- Nothing here keeps state from one call to the next that changes what a
-- call does: the only tables that outlive a call are pure memos, functions
-- of their input (ints: small integers as strings; nums: numbers of strings;
-- ttl_ms/ttl_arg: the last TTL argument formatted; specs: parsed specs).

local byte, call, format, char, sub, rep = string.byte, redis.call, string.format, string.char, string.sub, string.rep
local floor, ceil, min, max, type, unpack, str2d = math.floor, math.ceil, math.min, math.max, type, unpack, tonumber

-- tonumber: Lua's, kept (up to 4096 strings): Lua's costs a strtod, four
-- times this, and replies and arguments repeat; times seldom do (str2d).
local nums, nnums = {}, 0
local function tonumber(s)
  if nums[s] or s == nil then return nums[s] end
  if nnums >= 4096 then nums, nnums = {}, 0 end
  nums[s], nnums = str2d(s), nnums + 1
  return nums[s]
end

-- now_us returns the time passed in (tests), or the server's TIME.
local function now_us(arg)
  local t = arg and tonumber(arg)
  if t and t > 0 then return t end
  local tm = call('TIME')
  return tonumber(tm[1]) * 1000000 + str2d(tm[2]) -- µs: seldom twice
end

-- Redis formats a number argument with printf (about 0.3 µs, a short
-- command's cost); a string goes as it is: recurring ones are made once.
local ints, ttl_ms, ttl_arg = {}, -1, ''

-- int_arg returns x for a redis.call argument: a string for a small integer.
local function int_arg(x)
  if ints[x] or x < 0 or x >= 4096 or x % 1 ~= 0 then return ints[x] or x end
  ints[x] = format('%d', x)
  return ints[x]
end

-- px_arg returns the PX argument of a TTL of us µs: whole ms, rounded up,
-- >= 1, made once a ms (see int_arg).
local function px_arg(us)
  local ms = max(ceil(us / 1000), 1)
  if ms ~= ttl_ms then ttl_ms, ttl_arg = ms, format('%d', ms) end
  return ttl_arg
end

-- wrongtype is the error of a key that holds a value of no layout known
-- here: an error of that call alone, as Redis's own WRONGTYPE.
local function wrongtype(key)
  error({err = 'WRONGTYPE ratewindow: ' .. key .. ' holds a value of an unknown format'})
end

-- Sliding log: the times of the units counted; a unit at s counts while now
-- - window < s (reservations are in the future). A key never holds more
-- than Count units that count (see log_check). Two layouts:
--   compact  a string: w (1 to 7), base (7 bytes), then each unit's offset
--            from base, w bytes, oldest first, all big-endian; at most
--            LOG_WHOLE bytes, read whole by the decision's MGET. Written
--            anew, its base is its oldest time and w as narrow as it can.
--   sorted   a sorted set for longer logs: one member per time at which
--            units were recorded, "<units>:<time>", scored by the time, and
--            '#' scored minus the units of the others (a check reads one
--            score, not the members). AllowN(n) adds one member; what left
--            is counted from the nearer end (what leaves, or what stays),
--            as a denial's retry is found; no call rewrites the log.
-- A compact log that outgrows LOG_WHOLE becomes sorted; a sorted log added
-- to at LOG_BACK units or fewer becomes compact again (well below
-- LOG_WHOLE / 7: no log is turned back and forth).
local LOG_WHOLE, LOG_BACK = 512, 32

-- uint reads the w-byte big-endian integer at position i of s; uint_bytes
-- writes x as one, or with lead: lead, x in 7 bytes, 0. One byte or char
-- call each (a C call costs as much as the arithmetic of seven bytes).
local function uint(s, i, w)
  local x, b, c, d, e, f, g = byte(s, i, i + w - 1)
  if w < 4 then return w == 1 and x or w == 2 and x * 256 + b or (x * 256 + b) * 256 + c end
  x = ((x * 256 + b) * 256 + c) * 256 + d
  return w == 4 and x or w == 5 and x * 256 + e or w == 6 and (x * 256 + e) * 256 + f or ((x * 256 + e) * 256 + f) * 256 + g
end
local function uint_bytes(x, w, lead)
  local s = char(lead or 0, (x - x % 2^48) / 2^48 % 256, (x - x % 2^40) / 2^40 % 256, (x - x % 2^32) / 2^32 % 256,
    (x - x % 2^24) / 2^24 % 256, (x - x % 65536) / 65536 % 256, (x - x % 256) / 256 % 256, x % 256, 0)
  return lead and s or sub(s, 9 - w, 8)
end

-- compact_w returns the offset width of the compact log v, or fails for a
-- string of another format.
local function compact_w(key, v)
  local f = byte(v, 1) or 0
  if #v < 9 or f < 1 or f > 7 or (#v - 8) % f ~= 0 then wrongtype(key) end
  return f
end

-- compact_after returns the first unit of the compact log v from lo whose
-- time is after t: used + 1 for none.
local function compact_after(v, w, base, lo, used, t)
  local hi = used + 1
  while lo < hi do
    local m = floor((lo + hi) / 2)
    if base + uint(v, 9 + (m - 1) * w, w) > t then hi = m else lo = m + 1 end
  end
  return lo
end

-- member returns the sorted log's member of u units at t; units and time_of
-- read them back (members are read without scores: half the strings).
local function member(t, u) return format('%d:%d', u, t) end
local function units(m)
  if byte(m, 2) == 58 then return byte(m, 1) - 48 end -- one digit, then ':'
  return tonumber(string.match(m, '^%d+'))
end
local function time_of(m) return str2d(sub(m, string.find(m, ':', 1, true) + 1)) end

-- log_store writes the log of key anew: the units at times (in order) and n
-- more at t, compact if it fits, else sorted, until its newest unit leaves.
local function log_store(key, times, t, n, window, now)
  local p, all = #times + 1, #times
  while p > 1 and times[p - 1] > t do p = p - 1 end
  local base, newest = min(times[1] or t, t), max(times[all] or t, t)
  local w, m = 1, 256 -- the narrowest offsets
  while newest - base >= m and w < 7 do w, m = w + 1, m * 256 end
  local ttl = px_arg(newest + window - now)
  if 8 + (all + n) * w <= LOG_WHOLE then
    local parts = {char(w) .. uint_bytes(base, 7)}
    for i = 1, p - 1 do parts[#parts + 1] = uint_bytes(times[i] - base, w) end
    parts[#parts + 1] = rep(uint_bytes(t - base, w), n)
    for i = p, all do parts[#parts + 1] = uint_bytes(times[i] - base, w) end
    call('SET', key, table.concat(parts), 'PX', ttl)
    return
  end
  local zs, i, at_t = {-(all + n), '#'}, 1, n
  while i <= all do -- members, the n units at t among them
    local j = i
    while j < all and times[j + 1] == times[i] do j = j + 1 end
    local u = j - i + 1
    if times[i] == t then u, at_t = u + n, 0 end
    zs[#zs + 1], zs[#zs + 2] = times[i], member(times[i], u)
    i = j + 1
  end
  if at_t > 0 then zs[#zs + 1], zs[#zs + 2] = t, member(t, n) end
  call('DEL', key)
  for c = 1, #zs, 1000 do -- unpack takes a few thousand values at most
    call('ZADD', key, unpack(zs, c, min(c + 999, #zs)))
  end
  call('PEXPIRE', key, ttl)
end

-- sorted_walk returns the time of the j-th unit from the oldest (or the
-- newest) end of the sorted log key, total units in card members after
-- oldest: by rank when each member holds one unit, else 256 members read at
-- a time; then minus the units its member holds beyond the j-th, and it.
local function sorted_walk(key, oldest, j, newest_first, total, card)
  card = card or call('ZCARD', key) - 1
  if total == card then
    if newest_first then j = -j end
    return str2d(call('ZRANGE', key, j, j, 'WITHSCORES')[2]), 0
  end
  local lo, hi = format('(%d', oldest), '+inf'
  while true do
    local r = newest_first and call('ZREVRANGEBYSCORE', key, hi, lo, 'LIMIT', 0, 256) or
      call('ZRANGEBYSCORE', key, lo, hi, 'LIMIT', 0, 256)
    if #r == 0 then wrongtype(key) end -- fewer units than '#' says
    for i = 1, #r do
      j = j - units(r[i])
      if j <= 0 then return time_of(r[i]), j, r[i] end
    end
    local edge = format('(%d', time_of(r[#r]))
    if newest_first then hi = edge else lo = edge end
  end
end

-- sorted_open drops the members of the sorted log key (its '#' scored
-- score) at or before oldest and returns the units that stay, the newest
-- time (false: none, the key deleted) and the members (false: not counted).
local function sorted_open(key, score, oldest)
  local total, card = -score, false
  local first = call('ZRANGE', key, 1, 1, 'WITHSCORES')
  if total < 1 or not first[2] then wrongtype(key) end -- a sorted set, not ours
  if str2d(first[2]) <= oldest then
    local all, gone = call('ZCARD', key) - 1, call('ZCOUNT', key, 0, oldest)
    card = all - gone
    if card == 0 then call('DEL', key) return 0, false, 0 end
    if total == all then -- one unit a member
      total = card
    elseif gone <= card then -- count what leaves, or what stays
      for _, m in ipairs(call('ZRANGEBYSCORE', key, 0, oldest)) do total = total - units(m) end
    else
      total = 0
      for _, m in ipairs(call('ZRANGEBYSCORE', key, format('(%d', oldest), '+inf')) do total = total + units(m) end
    end
    call('ZREMRANGEBYSCORE', key, 0, oldest)
    call('ZADD', key, -total, '#')
  end
  return total, str2d(call('ZREVRANGE', key, 0, 0, 'WITHSCORES')[2]), card
end

-- log_check checks n units of a log limit, v the compact string, a sorted
-- log's '#' score or false (see log_value), and returns free, retry, reset,
-- then for log_add the units that count, the first of them (compact), the
-- newest unit's time (false: none) and the base (compact).
local function log_check(key, v, count, window, n, now)
  local oldest, used, lo, newest, retry, base, all = now - window, 0, 1, false, 0
  local k = count - n + 1 -- n fit once the k-th newest unit has left
  if type(v) == 'number' then
    local card
    used, newest, card = sorted_open(key, v, oldest)
    if k <= used and k >= 1 then
      local j = used - k + 1 -- the k-th newest is the j-th oldest
      retry = sorted_walk(key, oldest, min(j, k), k < j, used, card) + window - now
    end
  elseif v then
    local w = compact_w(key, v)
    base, all = uint(v, 2, 7), (#v - 8) / w
    if base + uint(v, 9, w) <= oldest then lo = compact_after(v, w, base, 1, all, oldest) end
    used = all - lo + 1
    if used > 0 then newest = base + uint(v, 9 + (all - 1) * w, w) end
    if k <= used and k >= 1 then retry = base + uint(v, 9 + (all - k) * w, w) + window - now end
  end
  if k <= 0 then retry = -1 end -- then any window holds at most count - n others
  return max(count - used, 0), retry, newest and newest + window - now or 0, used, lo, newest, base
end

-- log_add records n units at t (>= now) after every unit at or before t
-- (the end, but for reservations), v, used, lo, newest and base (nil: read
-- again) log_check's, and returns the new reset.
local function log_add(key, v, used, lo, newest, window, n, t, now, base)
  local last = max(newest or t, t)
  if type(v) == 'number' then -- sorted: one member more, or one grown
    if used + n <= LOG_BACK then -- compact again (its units all count: see sorted_open)
      local times = {}
      for _, m in ipairs(call('ZRANGE', key, 1, -1)) do
        for _ = 1, units(m) do times[#times + 1] = time_of(m) end
      end
      log_store(key, times, t, n, window, now)
      return last + window - now
    end
    local had = 0
    if newest and newest >= t then -- a member at t may be there already
      local m = call('ZRANGEBYSCORE', key, t, t)[1]
      if m then had = units(m); call('ZREM', key, m) end
    end
    call('ZADD', key, t, member(t, had + n), -(used + n), '#')
    call('PEXPIRE', key, px_arg(last + window - now))
    return last + window - now
  end
  if not v then -- n units at t: offsets of one byte, all 0 (or sorted)
    log_store(key, {}, t, n, window, now)
    return t + window - now
  end
  local w = byte(v, 1)
  local all, base = (#v - 8) / w, base or uint(v, 2, 7)
  local p = all + 1
  if newest and newest > t then p = compact_after(v, w, base, lo, all, t) end
  local off = t - base
  if off >= 0 and off < 256 ^ w and 8 + (used + n) * w <= LOG_WHOLE then -- cut and joined
    local add = n == 1 and uint_bytes(off, w) or rep(uint_bytes(off, w), n)
    if lo > 1 or p <= all then -- else appended
      add = sub(v, 9 + (lo - 1) * w, 8 + (p - 1) * w) .. add .. sub(v, 9 + (p - 1) * w)
      v = sub(v, 1, 8)
    end
    call('SET', key, v .. add, 'PX', px_arg(last + window - now))
  else -- written anew: narrower offsets, or sorted
    local times = {}
    for i = 9 + (lo - 1) * w, #v, w do times[#times + 1] = base + uint(v, i, w) end
    log_store(key, times, t, n, window, now)
  end
  return last + window - now
end

-- log_value returns the value of the log of key for log_check: the string v
-- read already, a sorted log's '#' score, or false for none.
local function log_value(key, v)
  if v then return v end
  local score = redis.pcall('ZSCORE', key, '#')
  if score and not score.err then return tonumber(score) end
  if score or call('EXISTS', key) == 1 then wrongtype(key) end
  return false
end

-- log_remove removes up to n units in (after, upto], the newest first, from
-- the log of key and returns how many.
local function log_remove(key, window, n, after, upto, now)
  local oldest = now - window
  after = max(after, oldest)
  local v = log_value(key, call('MGET', key)[1]) -- MGET: no error for a sorted set
  if type(v) == 'number' then -- the newest first, 256 members at a time
    local total, newest, card = sorted_open(key, v, oldest)
    if after <= oldest and upto >= (newest or 0) and n > total / 2 then -- the oldest kept
      if n >= total then call('DEL', key) return total end
      local t, j, m = sorted_walk(key, oldest, total - n, false, total, card)
      call('ZREMRANGEBYSCORE', key, format('(%d', t), upto)
      if j < 0 then call('ZREM', key, m) call('ZADD', key, t, member(t, units(m) + j)) end
      call('ZADD', key, n - total, '#')
      return n
    end
    local given, low, hi = 0, nil, upto
    while given < n do
      local r = call('ZREVRANGEBYSCORE', key, hi, format('(%d', after), 'LIMIT', 0, 256)
      if #r == 0 then break end
      for i = 1, #r do
        local u = units(r[i])
        local take = min(u, n - given)
        given = given + take
        if take < u then -- the last one, in part
          local t = time_of(r[i])
          call('ZADD', key, t, member(t, u - take))
          call('ZREM', key, r[i])
          break
        end
        low = r[i]
        if given == n then break end
      end
      hi = format('(%d', time_of(r[#r]))
    end
    if low then call('ZREMRANGEBYSCORE', key, time_of(low), upto) end
    if given == total then call('DEL', key) elseif given > 0 then call('ZADD', key, given - total, '#') end
    return given
  end
  if not v then return 0 end
  local w = compact_w(key, v)
  local base, all = uint(v, 2, 7), (#v - 8) / w
  local lo = compact_after(v, w, base, 1, all, oldest)
  local hi = compact_after(v, w, base, lo, all, upto) - 1 -- the newest at or before upto
  local p = max(compact_after(v, w, base, lo, all, after), hi - n + 1)
  local del = hi - p + 1
  if del <= 0 then return 0 end
  if all - lo + 1 == del then call('DEL', key) return del end
  local newest = base + uint(v, 9 + (all - 1) * w, w)
  if hi == all then newest = base + uint(v, 9 + (p - 2) * w, w) end
  call('SET', key, sub(v, 1, 8) .. sub(v, 9 + (lo - 1) * w, 8 + (p - 1) * w) ..
    sub(v, 9 + hi * w), 'PX', px_arg(newest + window - now))
  return del
end

-- Sliding buckets: a hash with one field per sub-window of prec µs, holding
-- its count; a bucket counts until its end plus window. A field is named by
-- the bucket's index (time / prec) modulo ring, a power of two above four
-- times the buckets of a window (small integers: the hash stays a listpack);
-- its index is the latest one at or before now with that remainder, or just
-- ahead when that is over half a ring back (the server's clock went back).
-- Fields older than a window are dropped on every check and the key expires
-- a window after its newest bucket ends: no two live buckets share a name.
--
-- A hash of more than BUCKETS_SUMMED live buckets also holds their sum:
-- field 't' the units counted, 'o' the newest bucket's index and the oldest
-- one counted (modulo ring: newest * ring + oldest). A check then reads two
-- fields and the buckets that left since the last one, not every field; an
-- add increments its bucket and 't'. A refund that empties a bucket drops
-- the sum, which the next check with many buckets writes again.
local BUCKETS_SUMMED, EMPTY = 8, {} -- EMPTY: a missing hash's fields, never written
local function bucket_ring(window, prec)
  local ring, need = 8, 4 * ceil(window / prec) + 4
  while ring < need do ring = ring * 2 end
  return ring
end

-- bucket_of returns the index of the bucket of field f (nil: the sum's).
local function bucket_of(f, current, ring)
  local b = tonumber(f)
  b = b and current - (current - b) % ring
  return b and (b < current - ring / 2 and b + ring or b)
end

-- buckets_retry returns the µs until n more units fit under count, the hash h
-- (HGETALL's reply) holding used: a window after the bucket freeing enough ends.
local function buckets_retry(h, count, window, prec, n, now, used, oldest, current, ring)
  local counts, last = {}, current -- by index, from oldest; the newest
  for i = 1, #h, 2 do
    local b = bucket_of(h[i], current, ring)
    if b and b >= oldest then counts[b - oldest + 1], last = tonumber(h[i + 1]), max(last, b) end
  end
  local over = used - (count - n) -- units that must leave first, oldest first (exact: n <= count)
  for b = oldest, last do
    over = over - (counts[b - oldest + 1] or 0)
    if over <= 0 then return (b + 1) * prec + window - now end
  end
  return 0
end

-- buckets_check checks n units of a buckets limit at now and returns free,
-- retry, reset, then what buckets_add takes: whether the hash keeps a sum,
-- its newest bucket (false: none) and the oldest one it counts.
local function buckets_check(key, count, window, prec, ring, n, now)
  local oldest = floor((now - window) / prec) -- older buckets have left
  local current = floor(now / prec)
  local used, newest, lo, h, summed = 0, nil, oldest, nil, false
  local len = call('HLEN', key) -- 0: missing, nothing more to read
  local sum = len > BUCKETS_SUMMED and call('HMGET', key, 't', 'o')
  if sum and sum[1] and sum[2] then -- the sum: drop the buckets that left since the last check
    summed = true
    local o = tonumber(sum[2])
    local lo_f = o % ring
    used = tonumber(sum[1])
    newest = bucket_of((o - lo_f) / ring, current, ring)
    lo = bucket_of(lo_f, current, ring)
    if lo < oldest then
      local gone = {}
      for b = lo, min(oldest - 1, lo + ring - 1) do gone[#gone + 1] = b % ring end
      local counts = call('HMGET', key, unpack(gone))
      for i = 1, #counts do used = used - (tonumber(counts[i]) or 0) end
      call('HDEL', key, unpack(gone))
      if used > 0 and newest >= oldest then
        call('HSET', key, 't', used, 'o', (newest % ring) * ring + oldest % ring)
      else -- nothing left: not even the sum
        call('DEL', key)
        used, newest = 0, nil
      end
      lo = oldest
    end
  else
    h = len > 0 and call('HGETALL', key) or EMPTY
    local live, stale = 0, nil
    for i = 1, #h, 2 do
      local b = bucket_of(h[i], current, ring)
      if not b or b < oldest then -- left, or half a sum
        stale = stale or {}
        stale[#stale + 1] = h[i]
      else
        used, live = used + tonumber(h[i + 1]), live + 1
        if not newest or b > newest then newest = b end
      end
    end
    if stale then call('HDEL', key, unpack(stale)) end -- at most a ring's fields
    if live > BUCKETS_SUMMED then
      call('HSET', key, 't', used, 'o', (newest % ring) * ring + oldest % ring)
      summed = true
    end
  end
  local free, retry, reset = max(count - used, 0), 0, 0
  if newest then reset = (newest + 1) * prec + window - now end
  if n > count then
    retry = -1
  elseif used + n > count then -- only a denial needs the buckets in order
    retry = buckets_retry(h or call('HGETALL', key), count, window, prec, n, now, used, oldest, current, ring)
  end
  return free, retry, reset, summed, newest or false, lo
end

-- buckets_add records n units in the current bucket. The key expires a
-- window after the newest bucket ends, so its TTL is set when a bucket
-- starts: when its count is n (a refund that empties a bucket deletes it).
local function buckets_add(key, window, prec, ring, n, now, summed, newest, lo)
  local b = floor(now / prec)
  local reset = (max(b, newest or b) + 1) * prec + window - now -- the newest bucket's, maybe ahead
  if call('HINCRBY', key, ints[b % ring] or int_arg(b % ring), ints[n] or int_arg(n)) == n then
    call('PEXPIRE', key, px_arg(reset))
  end
  if summed then
    call('HINCRBY', key, 't', int_arg(n))
    if not newest or b > newest then call('HSET', key, 'o', int_arg((b % ring) * ring + lo % ring)) end
  end
  return reset
end

-- Sliding counter: the counts of the previous and the current fixed window
-- (index now / window), the previous one weighed by the part of it still in
-- the sliding window: p * (window - elapsed) / window + c. The state is one
-- integer, stored in the key's object itself (below 10000, shared):
--   ((p * COUNTER_RADIX) + c) * 16 + (index of the current window % 16)
-- The key expires at the end of the window after the current one, so 4
-- bits tell its window apart. Counts that do not fit (either at
-- COUNTER_RADIX or more, whatever the Count: limits of one algorithm and
-- window share the key) are stored as "<index> <p> <c>".
local COUNTER_RADIX = 4194304 -- 2^22

-- counter_state reads the counter value v (false: none) at now: the current
-- window's index, the previous and current counts, the µs elapsed in the
-- current window, and whether v is its integer form (an add may INCRBY).
local function counter_state(key, v, window, now)
  local c = floor(now / window)
  if not v then return c, 0, 0, now - c * window, false end
  local w, prev, cur
  local n = tonumber(v)
  if n then -- the integer form
    local wm = n % 16
    local pc = (n - wm) / 16
    cur = pc % COUNTER_RADIX
    prev = (pc - cur) / COUNTER_RADIX
    w = c - (c - wm) % 16
  else -- the string form
    local sw, sp, sc = string.match(v, '^(%d+) (%d+) (%d+)$')
    if not sw then wrongtype(key) end
    w, prev, cur = tonumber(sw), tonumber(sp), tonumber(sc)
  end
  if w ~= c then
    if w == c - 1 then prev, cur = cur, 0 else prev, cur = 0, 0 end
    return c, prev, cur, now - c * window, false
  end
  return c, prev, cur, now - c * window, n ~= nil
end

-- counter_check checks n units of a counter limit, the key's value v, and
-- returns free, retry, reset, then counter_state's values for counter_add.
local function counter_check(key, v, count, window, n, now)
  local c, prev, cur, elapsed, incr = counter_state(key, v, window, now)
  -- all in integers: prev*(window-elapsed) + used*window <= count*window
  local weighted = prev * (window - elapsed)
  local free, retry, reset = max(floor((count * window - weighted - cur * window) / window), 0), 0, 0
  if cur + prev > 0 then reset = (c + (cur > 0 and 2 or 1)) * window - now end
  if n > count then
    retry = -1
  elseif weighted + (cur + n) * window > count * window then
    if cur + n <= count then -- later in this window: prev*(window-e) <= (count-n-cur)*window
      retry = window - floor((count - n - cur) * window / prev) - elapsed
    else -- in the next window, where this one's count is the previous one
      retry = (c + 1) * window - now + window - floor((count - n) * window / cur)
    end
  end
  return free, retry, reset, c, prev, cur, incr
end

-- counter_write stores the counts of window c, until the end of the window
-- after the newest unit's (none left: deleted), and returns the reset.
local function counter_write(key, window, c, prev, cur, now)
  if cur == 0 and prev == 0 then call('DEL', key) return 0 end
  local reset = (c + (cur > 0 and 2 or 1)) * window - now
  local v = prev < COUNTER_RADIX and cur < COUNTER_RADIX and -- by the counts, not a Count
    int_arg(((prev * COUNTER_RADIX) + cur) * 16 + c % 16) or format('%d %d %d', c, prev, cur)
  call('SET', key, v, 'PX', px_arg(reset))
  return reset
end

-- counter_add records n units in the current window (c, prev, cur, incr:
-- counter_check's); to the current window's integer form, by INCRBY, which
-- keeps its TTL (n * 16 adds n to the current count).
local function counter_add(key, window, n, now, c, prev, cur, incr)
  if incr and cur > 0 and cur + n < COUNTER_RADIX then
    call('INCRBY', key, ints[n * 16] or int_arg(n * 16))
    return (c + 2) * window - now
  end
  return counter_write(key, window, c, prev, cur + n, now)
end

-- Refunds (Limiter.Refund, Rule.CountIf) give back up to n units recorded
-- within the last window and return how many. at > 0 is the time of the
-- decision that recorded them, so that exactly those go; at = 0 gives back
-- the newest units at or before now (never reservations).

local function buckets_refund(key, window, prec, n, now, at)
  local oldest = floor((now - window) / prec)
  local current, ring = floor(now / prec), bucket_ring(window, prec)
  local live = {} -- {index, field, count}, the newest first
  if at > 0 then
    local b = floor(at / prec)
    if b < oldest or b > current then return 0 end
    live[1] = {b, b % ring, tonumber(call('HGET', key, b % ring) or 0) or 0}
  else
    local h = call('HGETALL', key)
    for i = 1, #h, 2 do
      local b = bucket_of(h[i], current, ring)
      if b and b >= oldest then live[#live + 1] = {b, h[i], tonumber(h[i + 1])} end
    end
    table.sort(live, function(x, y) return x[1] > y[1] end)
  end
  local given, emptied = 0, false
  for _, e in ipairs(live) do
    local take = min(n - given, e[3])
    if take > 0 and take == e[3] then
      call('HDEL', key, e[2])
      emptied = true
    elseif take > 0 then
      call('HINCRBY', key, e[2], -take)
    end
    given = given + take
  end
  if given > 0 and call('HEXISTS', key, 't') == 1 then -- emptied: the sum counted anew
    if emptied then call('HDEL', key, 't', 'o') else call('HINCRBY', key, 't', -given) end
  end
  return given
end

local function counter_refund(key, window, n, now, at)
  local c, prev, cur = counter_state(key, call('GET', key), window, now)
  local from_cur, from_prev = true, true
  if at > 0 then
    local w = floor(at / window)
    from_cur, from_prev = w == c, w == c - 1
  end
  local given = 0
  if from_cur then
    given = min(n, cur)
    cur = cur - given
  end
  if from_prev then
    local take = min(n - given, prev)
    prev, given = prev - take, given + take
  end
  if given > 0 then counter_write(key, window, c, prev, cur, now) end
  return given
end

-- A block (Limiter.Block) makes a key exhausted under any limits until a
-- time; a later block never shortens an earlier one. An override (see
-- operate.go) gives the key its own Counts. Both live in the key's block
-- key, which a decision's MGET reads anyway: a key with neither costs
-- nothing more than before overrides. Its value is "<until µs>" for a block
-- alone (the format of every version: a ban holds for all), else "<until
-- µs> <end µs> <override>": until 0 for no block, end 0 for an override
-- without one, the override "<alg> <window µs> <count> ..." per limit. The
-- key expires with the later of the two (never, for an override without an
-- end); each half is read against its own time, and every write keeps the
-- other half (own_write). The penalty key keeps its name and format too.

-- own_of returns the µs a key whose block key holds v stays blocked, and
-- its override in force (nil: none) and that override's end (0: none).
local function own_of(v, now)
  local b = tonumber(v)
  if b or not v then return max((b or 0) - now, 0) end
  local u, e, o = string.match(v, '^(%d+) (%d+) (%d.*)$')
  if not u then return 0 end -- not ours: written over, as an expired block
  e = tonumber(e)
  if e > 0 and e <= now then o = nil end
  return max(tonumber(u) - now, 0), o, e
end

-- own_write writes key's block until untl (µs, passed: none) and override o
-- ending at e (nil: none; e 0: no end) at now, or deletes it for neither.
local function own_write(key, untl, o, e, now)
  if untl <= now then untl = 0 end
  if o and e > 0 and e <= now then o = nil end
  if not o then
    if untl == 0 then call('DEL', key) else call('SET', key, format('%d', untl), 'PX', px_arg(untl - now)) end
  elseif e == 0 then
    call('SET', key, format('%d 0 %s', untl, o))
  else
    call('SET', key, format('%d %d %s', untl, e, o), 'PX', px_arg(max(untl, e) - now))
  end
end

-- block_key blocks the key for d µs and returns the µs it stays blocked.
local function block_key(key, d, now)
  local b, o, e = own_of(call('GET', key), now)
  local untl = now + max(d, b)
  own_write(key, untl, o, e, now)
  return untl - now
end

-- penalize counts a denial under a Rule's Penalty and, at its number of
-- denials within its time, bans the key (block_key). The penalty key holds
-- "<end µs> <denials>" until end, the first denial's time plus within; v is
-- its value. Returns the µs of the ban, 0 when none started.
local function penalize(block, penalty, v, denials, within, ban, now)
  local se, sc = string.match(v or '', '^(%d+) (%d+)$')
  local ends, count = tonumber(se) or 0, tonumber(sc) or 0
  if ends <= now then ends, count = now + within, 0 end
  count = count + 1
  if count < denials then
    call('SET', penalty, format('%d %d', ends, count), 'PX', px_arg(ends - now))
    return 0
  end
  call('DEL', penalty)
  return block_key(block, ban, now)
end

-- spec_of returns the spec of a decision from the string raw (allow.lua's
-- ARGV[1]): commit, the penalty (denials, within µs, ban µs), then per limit
-- algorithm ('0' log, '1' buckets, '2' counter), count, window µs, precision
-- µs. Specs are kept by their string (up to SPECS_KEPT), parsed once; one
-- argument for all of it (each argument costs a call about 0.2 µs).
local specs, nspecs, SPECS_KEPT = {}, 0, 256
local function keep(raw, spec)
  if nspecs >= SPECS_KEPT then specs, nspecs = {}, 0 end
  specs[raw], nspecs = spec, nspecs + 1
  return spec
end
local function spec_of(raw)
  local spec = specs[raw]
  if spec then return spec end
  local v = {}
  for x in string.gmatch(raw, '%S+') do v[#v + 1] = tonumber(x) end
  local nlim = (#v - 4) / 4
  if nlim < 1 or nlim % 1 ~= 0 then error({err = 'ERR ratewindow: not a decision spec: ' .. raw}) end
  spec = {raw = raw, commit = v[1] == 1, denials = v[2], within = v[3], ban = v[4], limits = {}, reads = 0}
  for i = 1, nlim do
    local a = 4 * i
    spec.limits[i] = {alg = format('%d', v[a + 1]), count = v[a + 2], window = v[a + 3], prec = v[a + 4],
      ring = v[a + 1] == 1 and bucket_ring(v[a + 3], v[a + 4])} -- buckets: their ring
    if v[a + 1] ~= 1 then spec.reads = i end -- the last limit whose key the MGET reads
  end
  return keep(raw, spec)
end

-- override_count returns the Count of the key's override v (SetOverride's
-- "<alg> <window µs> <count> ...", see operate.go) for a limit of alg and
-- window, or nil; overridden returns spec with those Counts (over), kept,
-- and marked (over: the decision's answer carries the Counts).
local function override_count(v, alg, window)
  for a, w, c in string.gmatch(v, '(%d) (%d+) (%d+)') do
    if a == alg and tonumber(w) == window then return tonumber(c) end
  end
end
local function overridden(spec, v)
  local raw = spec.raw .. '\n' .. v -- no spec holds a newline
  if specs[raw] then return specs[raw] end
  local o = {raw = raw, commit = spec.commit, denials = spec.denials, within = spec.within, ban = spec.ban, limits = {},
    reads = spec.reads, over = true}
  for i, l in ipairs(spec.limits) do
    local c = override_count(v, l.alg, l.window)
    o.limits[i] = {alg = l.alg, count = c or l.count, window = l.window, prec = l.prec, ring = l.ring, over = c}
  end
  return keep(raw, o)
end

-- fresh_value returns the value that u units at now make in a missing key
-- of a log or counter limit l, and its TTL; for a log only if fresh_fits.
local function fresh_fits(l, u) return l.alg == '2' or 8 + u <= LOG_WHOLE end
local function fresh_value(l, u, now)
  if l.alg == '0' then return uint_bytes(now, 7, 1) .. rep('\0', u - 1), l.window end
  local c = floor(now / l.window)
  if u < COUNTER_RADIX then return int_arg(u * 16 + c % 16), (c + 2) * l.window - now end
  return format('%d 0 %d', c, u), (c + 2) * l.window - now
end

-- decide_at checks limit i, then (recursively) the limits after it, and on
-- the way back records its units if the decision is allowed and commits and
-- writes its answer: each check's values stay in its call's locals. fit is
-- min(free / n) over the limits before i. After the last check, the verdict:
-- whether the decision is allowed, its status and block (ban), and how many
-- decisions of the run it answers (k). A key the MGET read as missing may
-- hold no string: unless careful, an admission writes it with SET NX, any
-- other decision asks whether it exists, and one found (a sorted log) makes
-- the decision go again, careful, after the keys this one wrote are deleted
-- (false). Returns true, allowed, status, ban, k.
local function decide_at(i, keys, lk, vals, vo, spec, n, now, out, at, runs, blocked, fit, careful)
  local limits = spec.limits
  local l, key, v = limits[i], keys[lk + i], vals[vo + i]
  local alg = l.alg
  if careful and alg ~= '1' and not v then
    v = log_value(key, false)
    if v and alg == '2' then wrongtype(key) end
  end
  local free, retry, reset, a, b, c, d
  if not v and not careful and alg ~= '1' then -- read as missing (see above): empty
    free, retry, reset = l.count, n > l.count and -1 or 0, 0
  elseif alg == '0' then
    free, retry, reset, a, b, c, d = log_check(key, v, l.count, l.window, n, now)
  elseif alg == '1' then
    free, retry, reset, a, b, c = buckets_check(key, l.count, l.window, l.prec, l.ring, n, now)
  else
    free, retry, reset, a, b, c, d = counter_check(key, v, l.count, l.window, n, now)
  end
  fit = retry == 0 and min(fit, floor(free / n)) or 0
  local ok, allowed, status, ban, k = true, fit >= 1 and blocked == 0, blocked > 0 and 1 or 0, blocked, runs
  if limits[i + 1] then
    ok, allowed, status, ban, k = decide_at(i + 1, keys, lk, vals, vo, spec, n, now, out, at, runs, blocked, fit, careful)
    if not ok then return false end
  else -- the verdict
    local write = allowed and spec.commit -- a denial changes nothing a check reads
    if write then k = max(min(runs, fit), 1) end
    for j = 1, careful and 0 or i do
      local lj = limits[j]
      if lj.alg ~= '1' and not vals[vo + j] then
        local found
        if write and fresh_fits(lj, k * n) then
          local vj, ttl = fresh_value(lj, k * n, now)
          found = not call('SET', keys[lk + j], vj, 'PX', px_arg(ttl), 'NX')
        else
          found = call('EXISTS', keys[lk + j]) == 1
        end
        if found then -- undo this decision's writes, and go again
          for h = 1, j - 1 do
            local lh = limits[h]
            if write and lh.alg ~= '1' and not vals[vo + h] and fresh_fits(lh, k * n) then call('DEL', keys[lk + h]) end
          end
          return false
        end
      end
    end
    if not allowed and blocked == 0 and spec.commit and spec.denials > 0 then
      ban = penalize(keys[lk - vo + 1], keys[lk], vals[vo], spec.denials, spec.within, spec.ban, now)
      if ban > 0 then status = 2 end
    end
  end
  if allowed and spec.commit then
    local u = k * n
    if not careful and alg ~= '1' and not v and fresh_fits(l, u) then -- written by the verdict
      reset = l.window
      if alg == '2' then reset = (floor(now / l.window) + 2) * l.window - now end
    elseif alg == '0' then
      reset = log_add(key, v, a, b, c, l.window, u, now, now, d)
    elseif alg == '1' then
      reset = buckets_add(key, l.window, l.prec, l.ring, u, now, a, b, c)
    else
      reset = counter_add(key, l.window, u, now, a, b, c, d)
    end
    free = free - n
  end
  if ban > 0 then
    free = 0
    if retry >= 0 and retry < ban then retry = ban end
    if reset < ban then reset = ban end
  end
  local o = at + 3 * i
  out[o + 1], out[o + 2], out[o + 3] = free, retry, reset
  if spec.over then out[at + 3 + 3 * #limits + i] = l.over or 0 end
  return true, allowed, status, ban, k
end

-- decide decides whether n units fit under every limit of spec for one key
-- at now and, if they do and the spec commits, records them under every
-- limit: all or none. Its keys start at keys[first]: the block key, the
-- penalty key if the spec has a penalty, then the limits' keys, all read
-- by one MGET (a hash or sorted set reads as missing: see decide_at); an
-- override in the block key replaces Counts (overridden). A blocked key is
-- denied, retry and reset at least the block's time left. A committed
-- denial counts towards the penalty; the one that reaches it bans the key,
-- and its retry and reset are the ban's. The answer goes in out after
-- out[at]: allowed (1, 0), blocked (0, 1, 2: banned now; plus 4 under an
-- override), now, then per limit remaining (after the units), retry (-1:
-- never), reset, and under an override per limit the override's Count in
-- force (0: none). A key without one pays for overrides nothing more.
--
-- runs is how many such decisions come one after another (a hot key's in a
-- merged call: the same keys, spec, n and now; no penalty): decide answers
-- as many as one check can, as if made one by one, and returns the index of
-- its last value and how many it answered. At one now a decision fits iff
-- n <= free under every limit, and lowers each free by n: the first k =
-- min(runs, min free / n) fit, recorded by one add a limit, their answers
-- differing in remaining. A denial without penalty writes nothing a check
-- reads: every decision of the run is denied alike. The common case, one
-- limit (log or counter) read as missing, unblocked, runs * n fitting and
-- committed, goes in short: decide_at's SET NX (in its verdict) and answer.
local function decide(keys, first, n, now, spec, out, at, runs)
  local lk, nlim = spec.denials > 0 and first + 1 or first, #spec.limits -- limit i's key: keys[lk + i]
  local vals = call('MGET', unpack(keys, first, lk + spec.reads))
  local blocked, vo, over = 0, lk - first + 1, nil
  if vals[1] then
    blocked, over = own_of(vals[1], now)
    if over then spec = overridden(spec, over) end
  end
  local l, ok, allowed, status, _, k = spec.limits[1], false, true, 0, nil, runs
  if nlim == 1 and blocked == 0 and spec.commit and l.alg ~= '1' and not vals[vo + 1] and runs * n <= l.count and
    (l.alg == '2' or 8 + runs * n <= LOG_WHOLE) then -- the common case (found: careful, below)
    local v, ttl = fresh_value(l, k * n, now)
    ok = call('SET', keys[lk + 1], v, 'PX', px_arg(ttl), 'NX')
    out[at + 4], out[at + 5], out[at + 6] = l.count - n, 0, ttl -- decide_at's answer
    if spec.over then out[at + 7] = l.over or 0 end
  else
    ok, allowed, status, _, k = decide_at(1, keys, lk, vals, vo, spec, n, now, out, at, runs, blocked, runs, false)
  end
  if not ok then
    ok, allowed, status, _, k = decide_at(1, keys, lk, vals, vo, spec, n, now, out, at, runs, blocked, runs, true)
  end
  out[at + 1], out[at + 2], out[at + 3] = allowed and 1 or 0, spec.over and status + 4 or status, now
  local size = spec.over and 3 + 4 * nlim or 3 + 3 * nlim
  local last = at + size
  for _ = 2, k do -- the others of the run: the same answer, less remaining
    for i = 1, size do out[last + i] = out[last + i - size] end
    for i = 1, (allowed and spec.commit) and nlim or 0 do out[last + 3 * i + 1] = out[last + 3 * i + 1] - n end
    last = last + size
  end
  return last, k
end

-- The functions the scripts call (see functions.go), of KEYS and ARGV as
-- each script's file describes them.

local function allow(keys, args)
  local out = {0, 0, 0, 0, 0, 0}
  decide(keys, 1, nums[args[2]] or tonumber(args[2]), now_us(args[3]), spec_of(args[1]), out, 0, 1)
  return out
end

local function allow_batch(keys, args)
  local m, specs_ = tonumber(args[2]), {}
  for i = 1, m do specs_[i] = spec_of(args[2 + i]) end
  local at, out, o, key = 3 + m, {}, 0, 1
  local server_now -- read at most once
  local d, decisions = 1, tonumber(args[1])
  while d <= decisions do
    local si, sn, snow = args[at], args[at + 1], args[at + 2]
    local spec, n, now = specs_[nums[si] or tonumber(si)], nums[sn] or tonumber(sn), nums[snow] or tonumber(snow)
    if not now or now <= 0 then server_now = server_now or now_us(0); now = server_now end
    local nkeys = spec.denials > 0 and #spec.limits + 2 or #spec.limits + 1 -- block, penalty, limits
    -- the run: the decisions right after this one that ask the same of the
    -- same keys (a hot key's), which decide answers together
    local runs = 1
    while spec.commit and spec.denials == 0 and d + runs <= decisions and keys[key + nkeys * runs] == keys[key] do
      local a, k = at + 3 * runs, key + nkeys * runs -- the same block key (so key): the rest alike?
      local same = args[a] == si and args[a + 1] == sn and args[a + 2] == snow
      for i = 1, nkeys - 1 do same = same and keys[k + i] == keys[key + i] end
      if not same then break end
      runs = runs + 1
    end
    local size, left = 3 + 3 * #spec.limits, runs
    while left > 0 do
      local ok, last, answered = pcall(decide, keys, key, n, now, spec, out, o, left)
      if ok then
        o, left = last, left - answered
      else -- failed: -1, zeros (a key of another type fails as it is read, before any write)
        for i = o + 1, o + left * size do out[i] = (i - o) % size == 1 and -1 or 0 end
        o, left = o + left * size, 0
      end
    end
    key, at, d = key + nkeys * runs, at + 3 * runs, d + runs
  end
  return out
end

local function reserve(keys, args)
  local n, now, longest, from = tonumber(args[1]), now_us(args[2]), tonumber(args[3]), tonumber(args[5])
  for i = 2, from > 0 and #keys or 0 do log_remove(keys[i], tonumber(args[2 * i + 3]), n, from - 1, from, now) end
  local vals = call('MGET', unpack(keys))
  local blocked, over = own_of(vals[1], now)
  local at, st = now + max(blocked, tonumber(args[4])), {}
  for i = 2, #keys do -- limit i - 1 (after the block key)
    local window = tonumber(args[2 * i + 3])
    local count = over and override_count(over, '0', window) or tonumber(args[2 * i + 2])
    local v = log_value(keys[i], vals[i])
    local _, retry, _, used, lo, newest = log_check(keys[i], v, count, window, n, now)
    if retry < 0 then return {0, -1} end
    if now + retry > at then at = now + retry end
    st[#st + 1], st[#st + 2], st[#st + 3], st[#st + 4] = v, used, lo, newest
  end
  if longest >= 0 and at - now > longest then return {0, at - now} end
  for i = 2, #keys do
    local j = 4 * (i - 2)
    log_add(keys[i], st[j + 1], st[j + 2], st[j + 3], st[j + 4], tonumber(args[2 * i + 3]), n, at, now)
  end
  return {1, at - now, at}
end

local function release(keys, args)
  local n, at, now = tonumber(args[1]), tonumber(args[2]), now_us(args[3])
  local removed = 0
  for i, key in ipairs(keys) do
    removed = removed + log_remove(key, tonumber(args[3 + i]), n, at - 1, at, now)
  end
  return removed
end

local function refund(keys, args)
  local n, now, at = tonumber(args[1]), now_us(args[2]), tonumber(args[3])
  local out = {}
  for i, key in ipairs(keys) do
    local alg, window, prec = args[4 * i], tonumber(args[4 * i + 2]), tonumber(args[4 * i + 3])
    if alg == '0' then -- at > now: a reservation's time, not refunded
      local after, upto = now - window, now
      if at > 0 then after, upto = at - 1, at end
      out[i] = upto <= now and log_remove(key, window, n, after, upto, now) or 0
    elseif alg == '1' then
      out[i] = buckets_refund(key, window, prec, n, now, at)
    else
      out[i] = counter_refund(key, window, n, now, at)
    end
  end
  return out
end

local function block(keys, args)
  return block_key(keys[1], tonumber(args[2]), now_us(args[1]))
end

-- own's operations on a block key (operate.go): each keeps the other half.
local own_ops = {
  unblock = function(_, o, e) return 0, o, e end,
  set = function(b, _, _, args, now) -- the override ARGV[3], for ARGV[4] µs (0: no end)
    local d = tonumber(args[4])
    if not string.match(args[3] or '', '^%d[%d ]*$') or not d then -- own_of could not read it back
      error({err = 'ERR ratewindow: not an override: ' .. tostring(args[3])})
    end
    return b, args[3], d > 0 and now + d or 0
  end,
  rm = function(b) return b end,
}

local function own(keys, args)
  local now, op = now_us(args[1]), args[2]
  local b, o, e = own_of(call('GET', keys[1]), now)
  if op ~= 'read' then
    local f = own_ops[op]
    if not f then error({err = 'ERR ratewindow: no operation ' .. op}) end
    b, o, e = f(b, o, e, args, now)
    own_write(keys[1], b > 0 and now + b or 0, o, e, now)
  end
  return {b, o and (e > 0 and e - now or 0) or -1, o or ''}
end

local function reset(keys, args)
  local now = now_us(args[1])
  local _, o, e = own_of(call('GET', keys[1]), now)
  own_write(keys[1], 0, o, e, now)
  local deleted = 0
  for i = 2, #keys, 1000 do -- in chunks: unpack takes a few thousand values at most
    deleted = deleted + call('DEL', unpack(keys, i, min(i + 999, #keys)))
  end
  return deleted
end
