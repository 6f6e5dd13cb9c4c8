-- algorithms.lua: the three sliding-window algorithms, the one decision over
-- several limits built on them, and the functions the scripts call (each
-- script is one call of one of them: allow, allow_batch, reserve, release,
-- refund, block; functions.go lists them, the function library exports
-- them). It reads no KEYS or ARGV itself.
--
-- Times are microseconds since the epoch. Lua numbers are doubles, exact for
-- integers up to 2^53, far beyond any time or count used here. Numbers are
-- passed to redis.call as numbers (Redis formats them with full precision)
-- or formatted with '%d'; never with tostring or '..', which would print
-- 1.76e+15.
--
-- A check returns the state of one limit as values (no table):
--   free   units that fit now (Count minus what is counted), >= 0
--   retry  µs until n more units fit: 0 now, -1 never (n > Count)
--   reset  µs until the limit is back to its full Count
-- then what its add needs. An add records n units, sets the key's TTL and
-- returns the new reset.
--
-- Nothing here keeps state from one call to the next that changes what a
-- call does: the only tables that outlive a call are pure memos, functions
-- of their input (ints: small integers as strings; ttl_us/ttl_arg: the last
-- TTL argument formatted; specs: parsed spec strings).

local byte, call = string.byte, redis.call

-- now_us returns the time passed in (tests), or the server's TIME.
local function now_us(arg)
  local t = arg and tonumber(arg)
  if t and t > 0 then return t end
  local tm = call('TIME')
  return tonumber(tm[1]) * 1000000 + tonumber(tm[2])
end

-- px returns the PX (or PEXPIRE) argument of a TTL of us microseconds:
-- rounded up to a millisecond, at least 1.
local function px(us)
  return math.max(math.ceil(us / 1000), 1)
end

-- Redis formats every number passed to redis.call with printf (about
-- 0.3 µs), as much as a short command, while a string goes as it is: the
-- arguments that recur go as strings made once (see the memos above).
local ints = {}
local ttl_us, ttl_arg = -1, ''

-- int_arg returns x for a redis.call argument: a string for a small integer.
local function int_arg(x)
  local s = ints[x]
  if s then return s end
  if x >= 0 and x < 4096 and x % 1 == 0 then
    s = string.format('%d', x)
    ints[x] = s
    return s
  end
  return x
end

-- px_arg returns px(us) for a redis.call argument (see int_arg).
local function px_arg(us)
  if us ~= ttl_us then ttl_us, ttl_arg = us, string.format('%d', px(us)) end
  return ttl_arg
end

-- wrongtype is the error of a key that holds a value of no layout known
-- here: an error of that call alone, as Redis's own WRONGTYPE.
local function wrongtype(key)
  error({err = 'WRONGTYPE ratewindow: ' .. key .. ' holds a value of an unknown format'})
end

-- Sliding log: the times of the units counted; a unit at time s counts while
-- now - window < s (reservations are units in the future). A key never
-- holds more than Count units that count (see log_check). Two layouts:
--
--   compact  a string: w (1 to 7), base (7 bytes, big-endian), then each
--            unit's time as an offset from base, w bytes big-endian, oldest
--            first; at most LOG_WHOLE bytes. Written anew, its base is its
--            oldest time and w as narrow as its newest needs: ten units
--            within 65 ms take 8 + 10 * 2 bytes. Most keys hold a few units
--            and are read whole, by the decision's MGET.
--   sorted   a sorted set for longer logs, so that no call rewrites the log
--            or does work in proportion to the units it holds: one member
--            per time at which units were recorded, "<units>:<time>",
--            scored by the time; and member '#', scored minus the units of
--            all the others (kept beside them, so that a check reads one
--            score, not the members). AllowN(n) adds one member; the
--            members that left are dropped (ZREMRANGEBYSCORE) after their
--            units are counted from the nearer end (those that left, or
--            those that stay); a denial's retry walks from the nearer end.
--
-- A compact log that outgrows LOG_WHOLE becomes sorted; a sorted log that
-- falls to LOG_BACK units becomes compact again as it is added to (well
-- below LOG_WHOLE / 7, so that a log is not turned back and forth).
local LOG_WHOLE, LOG_BACK = 512, 32

-- uint reads the w-byte big-endian integer at position i of s.
local function uint(s, i, w)
  local a, b, c, d, e, f, g = byte(s, i, i + w - 1)
  if w == 1 then return a end
  a = a * 256 + b
  if w == 2 then return a end
  a = a * 256 + c
  if w == 3 then return a end
  a = a * 256 + d
  if w == 4 then return a end
  a = a * 256 + e
  if w == 5 then return a end
  a = a * 256 + f
  if w == 6 then return a end
  return a * 256 + g
end

-- uint_bytes returns x as a w-byte big-endian integer (one string.char).
local function uint_bytes(x, w)
  local g = x % 256
  x = (x - g) / 256
  local f = x % 256
  x = (x - f) / 256
  local e = x % 256
  x = (x - e) / 256
  local d = x % 256
  x = (x - d) / 256
  local c = x % 256
  x = (x - c) / 256
  local b = x % 256
  local s = string.char((x - b) / 256 % 256, b, c, d, e, f, g)
  if w == 7 then return s end
  return string.sub(s, 8 - w)
end

-- width returns the bytes an offset of up to x takes: 1 to 7.
local function width(x)
  local w, m = 1, 256
  while x >= m and w < 7 do w, m = w + 1, m * 256 end
  return w
end

-- compact_w returns the offset width of the compact log v, or fails for a
-- value of no known layout (a string of another format under our key).
local function compact_w(key, v)
  local f = byte(v, 1) or 0
  if #v < 9 or f < 1 or f > 7 or (#v - 8) % f ~= 0 then wrongtype(key) end
  return f
end

-- compact_after returns the first unit of the compact log v (of width w,
-- used units, base) whose time is after t, from lo: used + 1 for none.
local function compact_after(v, w, base, lo, used, t)
  local hi = used + 1
  while lo < hi do
    local m = math.floor((lo + hi) / 2)
    if base + uint(v, 9 + (m - 1) * w, w) > t then hi = m else lo = m + 1 end
  end
  return lo
end

-- compact_times appends the times of units from to to of v to out.
local function compact_times(v, w, base, from, to, out)
  for i = 9 + (from - 1) * w, 8 + to * w, w do out[#out + 1] = base + uint(v, i, w) end
  return out
end

-- member returns the sorted log's member of u units at time t; units and
-- time_of read them back (a member is read without its score: a reply of
-- half the strings).
local function member(t, u) return string.format('%d:%d', u, t) end
local function units(m)
  if byte(m, 2) == 58 then return byte(m, 1) - 48 end -- one digit, then ':'
  return tonumber(string.match(m, '^%d+'))
end
local function time_of(m) return tonumber(string.sub(m, string.find(m, ':', 1, true) + 1)) end

-- log_store writes as the log of key the units at times (in order) and n
-- more at t, after those at or before t: compact if it fits, else sorted
-- (one member per time). Its TTL lasts until its newest unit has left.
local function log_store(key, times, t, n, window, now)
  local p, all = #times + 1, #times
  while p > 1 and times[p - 1] > t do p = p - 1 end
  local base, newest = math.min(times[1] or t, t), math.max(times[all] or t, t)
  local w = width(newest - base)
  local ttl = px_arg(newest + window - now)
  if 8 + (all + n) * w <= LOG_WHOLE then
    local parts = {string.char(w) .. uint_bytes(base, 7)}
    for i = 1, p - 1 do parts[#parts + 1] = uint_bytes(times[i] - base, w) end
    parts[#parts + 1] = string.rep(uint_bytes(t - base, w), n)
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
    call('ZADD', key, unpack(zs, c, math.min(c + 999, #zs)))
  end
  call('PEXPIRE', key, ttl)
end

-- sorted_walk returns the time of the j-th unit (from 1) from the oldest
-- (newest_first false) or the newest end of the units of the sorted log
-- key, all after oldest (see sorted_open), total units in card members: by
-- rank when each member holds one unit, else 256 members read at a time;
-- then, when its member holds more units than the j-th, minus how many,
-- and the member.
local function sorted_walk(key, oldest, j, newest_first, total, card)
  card = card or call('ZCARD', key) - 1
  if total == card then
    if newest_first then j = -j end
    return tonumber(call('ZRANGE', key, j, j, 'WITHSCORES')[2]), 0
  end
  local lo, hi = string.format('(%d', oldest), '+inf'
  while true do
    local r
    if newest_first then
      r = call('ZREVRANGEBYSCORE', key, hi, lo, 'LIMIT', 0, 256)
    else
      r = call('ZRANGEBYSCORE', key, lo, hi, 'LIMIT', 0, 256)
    end
    if #r == 0 then wrongtype(key) end -- fewer units than '#' says
    for i = 1, #r do
      j = j - units(r[i])
      if j <= 0 then return time_of(r[i]), j, r[i] end
    end
    local edge = string.format('(%d', time_of(r[#r]))
    if newest_first then hi = edge else lo = edge end
  end
end

-- sorted_open drops the members of the sorted log key, whose member '#' has
-- the score score, that left the window (at or before oldest) and returns
-- the units that stay, the newest time (false: none; the key is deleted)
-- and the members that stay (false: not counted).
local function sorted_open(key, score, oldest)
  local total, card = -score, false
  local first = call('ZRANGE', key, 1, 1, 'WITHSCORES')
  if total < 1 or not first[2] then wrongtype(key) end -- a sorted set, not ours
  if tonumber(first[2]) <= oldest then
    local all, gone = call('ZCARD', key) - 1, call('ZCOUNT', key, 0, oldest)
    card = all - gone
    if card == 0 then
      call('DEL', key)
      return 0, false, 0
    end
    if total == all then -- one unit a member
      total = card
    elseif gone <= card then -- count what leaves, or what stays
      for _, m in ipairs(call('ZRANGEBYSCORE', key, 0, oldest)) do total = total - units(m) end
    else
      total = 0
      for _, m in ipairs(call('ZRANGEBYSCORE', key, string.format('(%d', oldest), '+inf')) do
        total = total + units(m)
      end
    end
    call('ZREMRANGEBYSCORE', key, 0, oldest)
    call('ZADD', key, -total, '#')
  end
  return total, tonumber(call('ZREVRANGE', key, 0, 0, 'WITHSCORES')[2]), card
end

-- log_check checks n units of a log limit at now. v is the key's value:
-- the compact string, a number for a sorted log (its member '#''s score),
-- false for none (see log_value). It returns
-- free, retry, reset, then what log_add takes: the units that count, the
-- first unit that counts (compact: units before it have left) and the
-- newest unit's time (false: none).
local function log_check(key, v, count, window, n, now)
  local oldest, used, lo, newest = now - window, 0, 1, false
  local k = count - n + 1 -- n fit once the k-th newest unit has left
  local retry = 0
  if type(v) == 'number' then
    local card
    used, newest, card = sorted_open(key, v, oldest)
    if k <= used and k >= 1 then
      local j = used - k + 1 -- the k-th newest is the j-th oldest
      retry = sorted_walk(key, oldest, math.min(j, k), k < j, used, card) + window - now
    end
  elseif v then
    local w = compact_w(key, v)
    local base, all = uint(v, 2, 7), (#v - 8) / w
    if base + uint(v, 9, w) <= oldest then lo = compact_after(v, w, base, 1, all, oldest) end
    used = all - lo + 1
    if used > 0 then newest = base + uint(v, 9 + (all - 1) * w, w) end
    if k <= used and k >= 1 then retry = base + uint(v, 9 + (all - k) * w, w) + window - now end
  end
  -- n units fit at time t once the k-th newest unit has left the window at
  -- t: then every window holding t holds at most count - n other units
  if k <= 0 then retry = -1 end
  local reset = 0
  if newest then reset = newest + window - now end
  return math.max(count - used, 0), retry, reset, used, lo, newest
end

-- log_add records n units at time t (at or after now) in the log of key,
-- whose value v, units used, first unit lo and newest time are
-- log_check's, and returns the new reset. Units go after every unit at or
-- before t: at the end, but for reservations made for later than t.
local function log_add(key, v, used, lo, newest, window, n, t, now)
  local last = math.max(newest or t, t)
  if type(v) == 'number' then -- sorted: one member more, or one grown
    if used + n <= LOG_BACK then -- compact again (its units all count: see sorted_open)
      local r, times = call('ZRANGE', key, 1, -1, 'WITHSCORES'), {}
      for i = 1, #r, 2 do
        for _ = 1, units(r[i]) do times[#times + 1] = tonumber(r[i + 1]) end
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
  local base, all = uint(v, 2, 7), (#v - 8) / w
  local p = all + 1
  if newest and newest > t then p = compact_after(v, w, base, lo, all, t) end
  local off = t - base
  if off >= 0 and off < 256 ^ w and 8 + (used + n) * w <= LOG_WHOLE then -- cut and joined
    local nv
    if lo == 1 and p > all then
      nv = v .. string.rep(uint_bytes(off, w), n)
    else
      nv = string.sub(v, 1, 8) .. string.sub(v, 9 + (lo - 1) * w, 8 + (p - 1) * w) ..
           string.rep(uint_bytes(off, w), n) .. string.sub(v, 9 + (p - 1) * w)
    end
    call('SET', key, nv, 'PX', px_arg(last + window - now))
  else -- written anew: narrower offsets, or sorted
    log_store(key, compact_times(v, w, base, lo, all, {}), t, n, window, now)
  end
  return last + window - now
end

-- log_value returns the value of the log of key for log_check: the
-- compact string v (read already), the score of a sorted log's member '#'
-- (a sorted set without it is not ours), or false for none.
local function log_value(key, v)
  if v then return v end
  local score = redis.pcall('ZSCORE', key, '#')
  if score and not score.err then return tonumber(score) end
  if score or call('EXISTS', key) == 1 then wrongtype(key) end
  return false
end

-- log_remove removes up to n units with times in (after, upto] from the log
-- of key, the newest first, and returns how many; no unit before now -
-- window is touched.
local function log_remove(key, window, n, after, upto, now)
  local oldest = now - window
  after = math.max(after, oldest)
  local v = log_value(key, call('MGET', key)[1]) -- MGET: no error for a sorted set
  if type(v) == 'number' then -- the newest first, 256 members at a time
    local total, newest, card = sorted_open(key, v, oldest)
    if after <= oldest and upto >= (newest or 0) and n > total / 2 then -- the oldest kept
      if n >= total then
        if total > 0 then call('DEL', key) end
        return total
      end
      local t, j, m = sorted_walk(key, oldest, total - n, false, total, card)
      call('ZREMRANGEBYSCORE', key, string.format('(%d', t), upto)
      if j < 0 then
        call('ZREM', key, m)
        call('ZADD', key, t, member(t, units(m) + j))
      end
      call('ZADD', key, n - total, '#')
      return n
    end
    local given, low, hi = 0, nil, upto
    while given < n do
      local r = call('ZREVRANGEBYSCORE', key, hi, string.format('(%d', after), 'LIMIT', 0, 256)
      if #r == 0 then break end
      for i = 1, #r do
        local u = units(r[i])
        local take = math.min(u, n - given)
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
      hi = string.format('(%d', time_of(r[#r]))
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
  local p = math.max(compact_after(v, w, base, lo, all, after), hi - n + 1)
  local del = hi - p + 1
  if del <= 0 then return 0 end
  if all - lo + 1 == del then
    call('DEL', key)
    return del
  end
  local newest = base + uint(v, 9 + (all - 1) * w, w)
  if hi == all then newest = base + uint(v, 9 + (p - 2) * w, w) end
  call('SET', key, string.sub(v, 1, 8) .. string.sub(v, 9 + (lo - 1) * w, 8 + (p - 1) * w) ..
    string.sub(v, 9 + hi * w), 'PX', px_arg(newest + window - now))
  return del
end

-- Sliding buckets: a hash with one field per sub-window of prec µs, holding
-- its count. A bucket counts until its end plus window, so a unit is never
-- forgotten before it has left the window.
--
-- A field is named by the bucket's index (time / prec) modulo ring, a power
-- of two above four times the buckets of one window: small integers, so the
-- hash stays in the compact listpack encoding with 2- or 3-byte field names
-- (the default precision, window/60, gives ring 256). A field's index is the
-- latest one at or before now with that remainder. Every field is younger
-- than a window plus two buckets when read (older ones are dropped on every
-- check, and the key expires a window after its newest bucket ends), so no
-- two live buckets share a name.
--
-- A hash of more than BUCKETS_SUMMED live buckets also holds their sum:
-- field 't' the units counted, field 'o' the newest bucket's index and the
-- oldest one still counted (both modulo ring: newest * ring + oldest). A
-- check then reads two fields, and the buckets that left since the last
-- one (usually none), instead of every field; an add increments its bucket
-- and 't'. Smaller hashes are read whole and keep no sum, so a key of a few
-- buckets takes no more memory. A refund that empties a bucket drops the
-- sum, which the next check with many buckets writes again.
local BUCKETS_SUMMED = 8
local function bucket_ring(window, prec)
  local ring, need = 8, 4 * math.ceil(window / prec) + 4
  while ring < need do ring = ring * 2 end
  return ring
end

-- bucket_of returns the index of the bucket whose field is named f: the
-- latest index at or before current with that remainder (see above); nil
-- for a field that names no bucket (the sum's).
local function bucket_of(f, current, ring)
  f = tonumber(f)
  return f and current - (current - f) % ring
end

-- buckets_retry returns the µs until n more units fit under count, the
-- hash h (HGETALL's reply) holding used units: the end of the bucket whose
-- leaving frees enough, plus the window.
local function buckets_retry(h, count, window, prec, n, now, used, oldest, current, ring)
  local counts = {} -- by index, from oldest
  for i = 1, #h, 2 do
    local b = bucket_of(h[i], current, ring)
    if b and b >= oldest then counts[b - oldest + 1] = tonumber(h[i + 1]) end
  end
  local over = used + n - count -- units that must leave first, oldest first
  for b = oldest, current do
    over = over - (counts[b - oldest + 1] or 0)
    if over <= 0 then return (b + 1) * prec + window - now end
  end
  return 0
end

-- buckets_check checks n units of a buckets limit at now and returns free,
-- retry, reset, then what buckets_add takes: whether the hash keeps a sum,
-- its newest bucket (false: none) and the oldest one it counts.
local function buckets_check(key, count, window, prec, n, now)
  local oldest = math.floor((now - window) / prec) -- older buckets have left
  local current, ring = math.floor(now / prec), bucket_ring(window, prec)
  local used, newest, lo, h, summed = 0, nil, oldest, nil, false
  local sum = call('HMGET', key, 't', 'o')
  if sum[1] and sum[2] then
    summed = true
    -- the sum: drop the buckets that left since the last check
    local o = tonumber(sum[2])
    local lo_f = o % ring
    used = tonumber(sum[1])
    newest = bucket_of((o - lo_f) / ring, current, ring)
    lo = bucket_of(lo_f, current, ring)
    if lo < oldest then
      local gone = {}
      for b = lo, math.min(oldest - 1, lo + ring - 1) do gone[#gone + 1] = b % ring end
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
    h = call('HGETALL', key)
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
  local free, retry, reset = math.max(count - used, 0), 0, 0
  if newest then reset = (newest + 1) * prec + window - now end
  if n > count then
    retry = -1
  elseif used + n > count then -- only a denial needs the buckets in order
    retry = buckets_retry(h or call('HGETALL', key), count, window, prec, n, now, used, oldest, current, ring)
  end
  return free, retry, reset, summed, newest or false, lo
end

-- buckets_add records n units in the current bucket. The key expires a
-- window after the newest bucket ends: a time that changes only when a
-- bucket starts, so the TTL is set only then (when the bucket's count is
-- n: its field is new, since a refund that empties a bucket deletes it).
local function buckets_add(key, window, prec, n, now, summed, newest, lo)
  local b = math.floor(now / prec)
  local reset = (b + 1) * prec + window - now
  local ring = bucket_ring(window, prec)
  if call('HINCRBY', key, int_arg(b % ring), int_arg(n)) == n then
    call('PEXPIRE', key, px_arg(reset))
  end
  if summed then
    call('HINCRBY', key, 't', int_arg(n))
    if newest ~= b then call('HSET', key, 'o', int_arg((b % ring) * ring + lo % ring)) end
  end
  return reset
end

-- Sliding counter: the counts of the previous and the current fixed window
-- (index now / window). The estimate weighs the previous window by the part
-- of it still inside the sliding window:
--   p * (window - elapsed) / window + c
--
-- The state is one string key holding one integer, which Redis stores in
-- the key's object itself (and, below 10000, as a shared integer: no value
-- allocation at all):
--   ((p * COUNTER_RADIX) + c) * 16 + (index of the current window % 16)
-- The key expires at the end of the window after the current one, so a
-- live key's window is the current one, the previous one, or (within the
-- expiry's rounding to a millisecond) the one before: 4 bits tell them
-- apart. Counts that do not fit (either at COUNTER_RADIX or more: limits of
-- one algorithm and window share the key, whatever their Count) are stored
-- as "<index> <p> <c>" instead. Every number stays below 2^53, exact in Lua.
local COUNTER_RADIX = 4194304 -- 2^22

-- counter_state reads the counter value v (false: none) of a window of
-- window µs at now and returns the current window's index, the previous
-- and the current window's counts, the µs elapsed in the current window,
-- and whether v is the integer form of the current window (so that an add
-- can be an INCRBY).
local function counter_state(key, v, window, now)
  local c = math.floor(now / window)
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

-- counter_check checks n units of a counter limit at now, the key's value
-- v (false: none), and returns free, retry, reset, then what counter_add
-- takes: the current window's index and counts, and whether an INCRBY
-- records units (see counter_state).
local function counter_check(key, v, count, window, n, now)
  local c, prev, cur, elapsed, incr = counter_state(key, v, window, now)
  -- all in integers: prev*(window-elapsed) + used*window <= count*window
  local weighted = prev * (window - elapsed)
  local free, retry, reset = math.max(math.floor((count * window - weighted - cur * window) / window), 0), 0, 0
  if cur > 0 then
    reset = (c + 2) * window - now
  elseif prev > 0 then
    reset = (c + 1) * window - now
  end
  if n > count then
    retry = -1
  elseif weighted + (cur + n) * window > count * window then
    if cur + n <= count then
      -- later in this window: prev*(window-e) <= (count-n-cur)*window
      local e = window - math.floor((count - n - cur) * window / prev)
      retry = e - elapsed
    else
      -- in the next window, where this one's count is the previous one
      local e = window - math.floor((count - n) * window / cur)
      retry = (c + 1) * window - now + e
    end
  end
  return free, retry, reset, c, prev, cur, incr
end

-- counter_write stores the counts of window c (prev, cur), with the TTL
-- the state needs: until the end of the window after the newest unit's. A
-- state with no unit left is deleted. It returns the reset.
local function counter_write(key, window, c, prev, cur, now)
  local reset
  if cur > 0 then
    reset = (c + 2) * window - now
  elseif prev > 0 then
    reset = (c + 1) * window - now
  else
    call('DEL', key)
    return 0
  end
  local v
  if prev < COUNTER_RADIX and cur < COUNTER_RADIX then -- by the counts, not a Count
    v = ((prev * COUNTER_RADIX) + cur) * 16 + c % 16
    v = int_arg(v)
  else
    v = string.format('%d %d %d', c, prev, cur)
  end
  call('SET', key, v, 'PX', px_arg(reset))
  return reset
end

-- counter_add records n units in the current window; c, prev, cur and incr
-- are counter_check's. A key that holds the current window's integer form
-- keeps its TTL (the end of the next window): the units are added where
-- they stand, n * 16 adding n to the current count.
local function counter_add(key, window, n, now, c, prev, cur, incr)
  if incr and cur > 0 and cur + n < COUNTER_RADIX then
    call('INCRBY', key, int_arg(n * 16))
    return (c + 2) * window - now
  end
  return counter_write(key, window, c, prev, cur + n, now)
end

-- Refunds (Limiter.Refund, Rule.CountIf) give back up to n units recorded
-- within the last window, never going below empty, and return how many
-- they gave back. at > 0 names the time the units were recorded (the time
-- of the decision that took them), so that exactly those units go; at = 0
-- gives back the newest units recorded at or before now. Reservations
-- (units in the future) are never refunded.

local function log_refund(key, window, n, now, at)
  if at > 0 then
    if at <= now - window or at > now then return 0 end
    return log_remove(key, window, n, at - 1, at, now)
  end
  return log_remove(key, window, n, now - window, now, now)
end

local function buckets_refund(key, window, prec, n, now, at)
  local oldest = math.floor((now - window) / prec)
  local current, ring = math.floor(now / prec), bucket_ring(window, prec)
  local live = {} -- {index, field, count}, the newest first
  if at > 0 then
    local b = math.floor(at / prec)
    if b < oldest or b > current then return 0 end
    local c = tonumber(call('HGET', key, b % ring) or 0) or 0
    live[1] = {b, b % ring, c}
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
    if given == n then break end
    local take = math.min(n - given, e[3])
    if take > 0 then
      if take == e[3] then
        call('HDEL', key, e[2])
        emptied = true
      else
        call('HINCRBY', key, e[2], -take)
      end
      given = given + take
    end
  end
  if given > 0 and call('HEXISTS', key, 't') == 1 then
    if emptied then -- the newest or oldest bucket may have gone: counted anew
      call('HDEL', key, 't', 'o')
    else
      call('HINCRBY', key, 't', -given)
    end
  end
  return given
end

local function counter_refund(key, window, n, now, at)
  local c, prev, cur = counter_state(key, call('GET', key), window, now)
  local from_cur, from_prev = true, true
  if at > 0 then
    local w = math.floor(at / window)
    from_cur, from_prev = w == c, w == c - 1
  end
  local given = 0
  if from_cur then
    given = math.min(n, cur)
    cur = cur - given
  end
  if from_prev then
    local take = math.min(n - given, prev)
    prev, given = prev - take, given + take
  end
  if given > 0 then counter_write(key, window, c, prev, cur, now) end
  return given
end

-- A block (Limiter.Block) makes a key exhausted under any limits until a
-- time: its block key holds that time in µs, and expires with it. A later
-- block never shortens an earlier one. The block and penalty keys keep the
-- names and the format of every version of the library, so that a ban
-- holds for all of them.

-- blocked_for returns the µs a key whose block key holds v stays blocked
-- at now, 0 when it is not.
local function blocked_for(v, now)
  local untl = v and tonumber(v) or 0
  if untl > now then return untl - now end
  return 0
end

-- block_key blocks the key for d µs from now, unless it is blocked longer
-- already, and returns the µs it stays blocked.
local function block_key(key, d, now)
  local untl = math.max(now + d, tonumber(call('GET', key) or 0) or 0)
  call('SET', key, untl, 'PX', px(untl - now))
  return untl - now
end

-- penalize counts a denial under a Rule's Penalty and, at the Penalty's
-- number of denials within its time, bans the key: the same block as
-- Limiter.Block. The penalty key holds "<end µs> <denials>": the denials
-- counted since the first one, until end (the first one's time plus
-- within); it expires then. v is its value. Returns the µs of the ban, 0
-- when none started.
local function penalize(block, penalty, v, denials, within, ban, now)
  local ends, count = 0, 0
  if v then
    local se, sc = string.match(v, '^(%d+) (%d+)$')
    ends, count = tonumber(se) or 0, tonumber(sc) or 0
  end
  if ends <= now then ends, count = now + within, 0 end
  count = count + 1
  if count < denials then
    call('SET', penalty, string.format('%d %d', ends, count), 'PX', px(ends - now))
    return 0
  end
  call('DEL', penalty)
  return block_key(block, ban, now)
end

-- spec_of returns the spec of a decision (what it asks but its units and
-- time) from the string raw that holds it, its values separated by spaces:
-- commit ('1' records the units when they fit, '0' only looks), the
-- penalty (denials, 0: none; within µs; ban µs), then 4 values per limit:
-- algorithm ('0' log, '1' buckets, '2' counter), count, window µs,
-- precision µs. Specs are kept by their string (up to SPECS_KEPT, then
-- forgotten all at once), so that a spec is parsed once, and a call takes
-- one argument for all of it (each argument costs about 0.2 µs). A string
-- that is no spec is an error.
local specs, nspecs, SPECS_KEPT = {}, 0, 256
local function spec_of(raw)
  local spec = specs[raw]
  if spec then return spec end
  local v = {}
  for x in string.gmatch(raw, '%S+') do v[#v + 1] = tonumber(x) end
  local nlim = (#v - 4) / 4
  if nlim < 1 or nlim % 1 ~= 0 then error({err = 'ERR ratewindow: not a decision spec: ' .. raw}) end
  spec = {commit = v[1] == 1, denials = v[2], within = v[3], ban = v[4], limits = {}}
  for i = 1, nlim do
    local a = 4 * i
    spec.limits[i] = {alg = string.format('%d', v[a + 1]), count = v[a + 2], window = v[a + 3], prec = v[a + 4]}
  end
  if nspecs >= SPECS_KEPT then specs, nspecs = {}, 0 end
  specs[raw], nspecs = spec, nspecs + 1
  return spec
end

-- fresh_fits reports whether a key of limit l read as missing takes u
-- units by fresh_value.
local function fresh_fits(l, u) return l.alg == '2' or 8 + u <= LOG_WHOLE end

-- fresh_value returns the value a key of a log ('0') or counter ('2')
-- limit l read as missing takes with u units at now, and its TTL in µs;
-- for a log, only when fresh_fits.
local function fresh_value(l, u, now)
  if l.alg == '0' then
    return string.char(1) .. uint_bytes(now, 7) .. string.rep('\0', u), l.window
  end
  local c = math.floor(now / l.window)
  if u < COUNTER_RADIX then return int_arg(u * 16 + c % 16), (c + 2) * l.window - now end
  return string.format('%d 0 %d', c, u), (c + 2) * l.window - now
end

-- verdict ends the checks of a decision (see decide): whether it is
-- allowed (every limit fits, fit >= 1, and the key is not blocked), its
-- status and block, and how many decisions of the run it answers. Keys
-- that the MGET read as missing were read so only if they hold no string:
-- unless careful, an admission writes their units with SET NX first, and
-- any other decision asks whether they exist; a key found there after all
-- (a sorted log, a value of another type) makes the decision go again,
-- careful (nothing written: the keys it wrote with NX are deleted).
local function verdict(keys, lk, vals, vo, spec, n, now, runs, blocked, fit, careful)
  local limits, allowed = spec.limits, fit >= 1 and blocked == 0
  local commit = spec.commit
  local k = 1
  if allowed and commit then k = math.max(math.min(runs, fit), 1) end
  if not careful then
    local write = allowed and commit
    for i = 1, #limits do
      local l, key = limits[i], keys[lk + i]
      if l.alg ~= '1' and not vals[vo + i] then
        local found
        if write and fresh_fits(l, k * n) then
          local v, ttl = fresh_value(l, k * n, now)
          found = not call('SET', key, v, 'PX', px_arg(ttl), 'NX')
        else
          found = call('EXISTS', key) == 1
        end
        if found then -- undo this decision's writes, and go again
          for j = 1, i - 1 do
            local lj = limits[j]
            if write and lj.alg ~= '1' and not vals[vo + j] and fresh_fits(lj, k * n) then call('DEL', keys[lk + j]) end
          end
          return false
        end
      end
    end
  end
  local status = 0
  if blocked > 0 then
    status = 1
  elseif not allowed and commit and spec.denials > 0 then
    blocked = penalize(keys[lk - 1], keys[lk], vals[2], spec.denials, spec.within, spec.ban, now)
    if blocked > 0 then status = 2 end
  end
  if not allowed then k = runs end -- a denial changes nothing a check reads
  return true, allowed, status, blocked, k
end

-- decide_at checks limit i of a decision, then (recursively) the limits
-- after it, and on the way back records its units when the decision is
-- allowed and commits, and writes its answer: the values of each limit's
-- check stay in this call's locals. fit is min(free / n) over the limits
-- before i. Returns verdict's values.
local function decide_at(i, keys, lk, vals, vo, spec, n, now, out, at, runs, blocked, fit, careful)
  local l = spec.limits[i]
  if not l then return verdict(keys, lk, vals, vo, spec, n, now, runs, blocked, fit, careful) end
  local key, alg, v = keys[lk + i], l.alg, vals[vo + i]
  if careful and alg ~= '1' and not v then
    v = log_value(key, false)
    if v and alg == '2' then wrongtype(key) end
  end
  local free, retry, reset, a, b, c, d
  if alg == '0' then
    free, retry, reset, a, b, c = log_check(key, v, l.count, l.window, n, now)
  elseif alg == '1' then
    free, retry, reset, a, b, c = buckets_check(key, l.count, l.window, l.prec, n, now)
  else
    free, retry, reset, a, b, c, d = counter_check(key, v, l.count, l.window, n, now)
  end
  local f = math.floor(free / n)
  if retry ~= 0 then f = 0 end
  local ok, allowed, status, ban, k = decide_at(i + 1, keys, lk, vals, vo, spec, n, now, out, at, runs, blocked,
    math.min(fit, f), careful)
  if not ok then return false end
  if allowed and spec.commit then
    local u = k * n
    if not careful and alg ~= '1' and not v and fresh_fits(l, u) then -- written by verdict
      reset = l.window
      if alg == '2' then reset = (math.floor(now / l.window) + 2) * l.window - now end
    elseif alg == '0' then
      reset = log_add(key, v, a, b, c, l.window, u, now, now)
    elseif alg == '1' then
      reset = buckets_add(key, l.window, l.prec, u, now, a, b, c)
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
  return true, allowed, status, ban, k
end

-- decide decides whether n units fit under every limit of spec for one key
-- at now and, when they do and the spec commits, records them under every
-- limit: all or none. Its keys start at keys[first]: the key's block key,
-- its penalty key when the spec has a penalty, then the storage keys of
-- the limits, all read by one MGET (a hash, or a sorted log, reads as
-- missing: see verdict). A blocked key is denied under every limit, with a
-- retry and reset of at least the block's time left, and nothing recorded.
-- A committed denial of a key that is not blocked counts towards its
-- penalty; the denial that reaches it bans the key (see penalize), and its
-- retry and reset are the ban's.
--
-- It writes its answer into out after out[at]: allowed (1 or 0), blocked
-- (0: no, 1: the key is blocked, 2: this denial banned it), now, then per
-- limit: remaining, retry µs, reset µs (remaining after the units were
-- recorded; retry 0 for a limit that admits, -1 for one that never can).
--
-- runs is how many such decisions come one after another (a hot key's in
-- one merged call: the same keys, spec, n and now; no penalty). decide
-- answers as many of them as one check can, each as if made alone in turn,
-- and returns the index of its last value and how many it answered:
--   admitted  at one now, a decision fits iff n <= free under every limit,
--             and its units lower each free by n; so the first k = min(runs,
--             min free / n) fit, and their k * n units are recorded at
--             once, in one add per limit. The answers differ only in
--             remaining.
--   denied    a denial without penalty writes nothing that a check reads,
--             so every decision of the run is denied alike.
local function decide(keys, first, n, now, spec, out, at, runs)
  local lk = first -- the key of limit i is keys[lk + i]
  if spec.denials > 0 then lk = first + 1 end
  local nlim = #spec.limits
  local vals = call('MGET', unpack(keys, first, lk + nlim))
  local blocked, vo = blocked_for(vals[1], now), lk - first + 1
  local ok, allowed, status, _, k = decide_at(1, keys, lk, vals, vo, spec, n, now, out, at, runs, blocked, runs, false)
  if not ok then
    ok, allowed, status, _, k = decide_at(1, keys, lk, vals, vo, spec, n, now, out, at, runs, blocked, runs, true)
  end
  out[at + 1], out[at + 2], out[at + 3] = allowed and 1 or 0, status, now
  local size = 3 + 3 * nlim
  local last = at + size
  for _ = 2, k do -- the others of the run: the same answer, less remaining
    for i = 1, size do out[last + i] = out[last + i - size] end
    if allowed and spec.commit then
      for i = 1, nlim do out[last + 3 * i + 1] = out[last + 3 * i + 1] - n end
    end
    last = last + size
  end
  return last, k
end

-- The functions the scripts call (see functions.go), each of its script's
-- KEYS and ARGV as the script's file describes them.

local function allow(keys, args)
  local out = {0, 0, 0, 0, 0, 0}
  decide(keys, 1, tonumber(args[2]), now_us(args[3]), spec_of(args[1]), out, 0, 1)
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
    local spec, n, now = specs_[tonumber(si)], tonumber(sn), tonumber(snow)
    if not now or now <= 0 then
      server_now = server_now or now_us(0)
      now = server_now
    end
    local nkeys = 1 + #spec.limits -- the block key, the limits' keys
    if spec.denials > 0 then nkeys = nkeys + 1 end -- and the penalty key
    -- the run: this decision and those right after it that ask the same of
    -- the same keys (a hot key's), which decide answers together
    local runs = 1
    if spec.commit and spec.denials == 0 then
      while d + runs <= decisions do
        local a, k = at + 3 * runs, key + nkeys * runs
        if args[a] ~= si or args[a + 1] ~= sn or args[a + 2] ~= snow then break end
        local same = true
        for i = 0, nkeys - 1 do
          if keys[k + i] ~= keys[key + i] then same = false break end
        end
        if not same then break end
        runs = runs + 1
      end
    end
    local size, left = 3 + 3 * #spec.limits, runs
    while left > 0 do
      local ok, last, answered = pcall(decide, keys, key, n, now, spec, out, o, left)
      if ok then
        o, left = last, left - answered
      else -- failed: -1, zeros (a key of another type fails as it is read, before any write)
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
end

local function reserve(keys, args)
  local n, now, longest = tonumber(args[1]), now_us(args[2]), tonumber(args[3])
  local vals = call('MGET', unpack(keys))
  local at, st = now + blocked_for(vals[1], now), {}
  for i = 2, #keys do
    local v = log_value(keys[i], vals[i])
    local _, retry, _, used, lo, newest = log_check(keys[i], v, tonumber(args[2 * i]), tonumber(args[2 * i + 1]), n, now)
    if retry < 0 then return {0, -1} end
    if now + retry > at then at = now + retry end
    st[#st + 1], st[#st + 2], st[#st + 3], st[#st + 4] = v, used, lo, newest
  end
  if longest >= 0 and at - now > longest then return {0, at - now} end
  for i = 2, #keys do
    local j = 4 * (i - 2)
    log_add(keys[i], st[j + 1], st[j + 2], st[j + 3], st[j + 4], tonumber(args[2 * i + 1]), n, at, now)
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
    if alg == '0' then
      out[i] = log_refund(key, window, n, now, at)
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
