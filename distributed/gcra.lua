-- GCRA steps on any number of keys, atomically: the Lua twin of
-- algorithms.Limit (Decide, Refund, Peek, Charge); tests/store_test.go
-- requires identical results, stored TAT and TTL of both. One call decides
-- a batch (one TIME, one reply), of one hash slot on a Cluster; a key may
-- appear more than once, its steps applied in order.
--
-- KEYS[i]        the i-th key; its value is the TAT in integer microseconds
-- ARGV[1]        now in microseconds, or "" to use Redis TIME (production:
--                the server's clock is the only clock)
-- ARGV[4i-2..4i+1]  the i-th key's step:
--   T     emission interval in microseconds (>= 1)
--   B     burst in units of cost (>= 1)
--   cost
--   op    "d" decide, "r" refund, "p" peek, "c" charge (after the response:
--         the TAT moves on by cost*T whatever the burst; reported as a peek)
--         "b<first>,<max>" decide and "B<first>,<max>" peek (a post-charged
--         check) in a zone with ban: a banned key is denied until the ban's
--         end without a step; a key the step denies is banned for first µs,
--         escalating (max > first) to first·2^(level-1), at most max, while
--         the key is remembered (until max µs after its last ban's end);
--         "P0,0" is a peek that reports a ban as the ban ops do, starting none
--         "w<ahead>" decide in a zone with delay: a request the step would
--         deny whose allow time is at most ahead µs away is admitted for
--         later, its slot reserved, reported as allowed with 0 remaining; its
--         wait is reset − B·T
--         "b<first>,<max>,<ahead>" the ban decide of a zone with delay too
--
-- A key with a ban holds "TAT,ban end,remembered until,level" (µs, TAT 0
-- for none), with a TTL that reaches the later of its TAT and the end of
-- what is remembered; every op keeps the ban as it writes the TAT.
--
-- Returns 2 integers per key, flat: {r, reset_after_us}. r >= 0: allowed,
-- with r remaining (a refund: 0); r < 0: denied, retry after -r µs (> 0).
-- reset is -1 when the key held a value of another type and -2 a string
-- that is not a TAT: a value tally did not write (it would deny or admit
-- the key forever, with no TTL), deleted instead of decided on, an error
-- for that key alone. A ban op's denial of a banned key has reset =
-- -(8 + 2·level + started), started 1 when this step started the ban: its
-- retry is at least the ban's remaining time.
--
-- Numbers are doubles: µs since the epoch and every sum stay under 2^53,
-- exact integers; divisions are floored and corrected by one; '%d' formats
-- (redis.call's '%.17g' is slower). Shaped for what Redis runs (callgrind,
-- redis-server 7.0: one key per call 58.0k instructions, redis_rate's
-- 63.8k; 16 keys 27.5k per key): one loop, no local functions (a closure
-- costs about 1.5k per call), a limit parsed only when its string differs
-- from the previous key's (interned: comparing is free), a TTL formatted
-- only when it changes.

local floor, format, tonumber, match, byte, sub = math.floor, string.format, tonumber, string.match, string.byte, string.sub

local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local out = {0, 0}
local sT, sB, sC, T, B, cost -- the last limit parsed, as sent and as numbers
local num -- limits parsed, by string, once a batch has more than one (a global zone's keys alternate)
local lastMs, lastPX -- the last TTL written, as a number and as sent
local sOp, bFirst, bMax, sAhead, sBan -- the last ban or delay op parsed
for i = 1, #KEYS do
  local key, a, j = KEYS[i], 4 * i - 2, 2 * i - 1
  if ARGV[a] ~= sT then
    sT = ARGV[a]; T = num and num[sT]
    if not T then
      T = tonumber(sT)
      if i > 1 then num = num or {}; num[sT] = T end
    end
  end
  if ARGV[a + 1] ~= sB then
    sB = ARGV[a + 1]; B = num and num[sB]
    if not B then
      B = tonumber(sB)
      if i > 1 then num = num or {}; num[sB] = B end
    end
  end
  if ARGV[a + 2] ~= sC then sC = ARGV[a + 2]; cost = tonumber(sC) end
  local op = ARGV[a + 3]
  local ban, peekOnly -- a ban op: 'd' or 'p' is what it does when the key is not banned
  local ahead = 0 -- how far ahead a denied request may be admitted for later
  if op ~= 'd' and op ~= 'r' and op ~= 'p' and op ~= 'c' then
    if op ~= sOp then
      sOp = op
      if byte(op) == 119 then -- 'w'
        sAhead, sBan = tonumber(sub(op, 2)), false
      else
        local f, m, w = match(op, '^%a(%d+),(%d+),?(%d*)$')
        bFirst, bMax, sAhead, sBan = tonumber(f), tonumber(m), tonumber(w) or 0, true
      end
    end
    local c = byte(op)
    if c == 98 or c == 119 then op = 'd' else op = 'p' end -- 'b' or 'w', or 'B'
    ban = sBan                                             -- (and 'P': a peek
    peekOnly = c == 80                                     -- that reports the ban
    if op == 'd' then ahead = sAhead end                   -- and starts none)
  end
  local raw = redis.pcall('GET', key)
  local stored = 0
  local bEnd, bMem, bLvl -- the key's ban, if it has one
  if raw then
    stored = tonumber(raw) -- nil for an error reply (a table) or a foreign string
    if not stored and type(raw) == 'string' then
      local t, e, m, l = match(raw, '^(%d+),(%d+),(%d+),(%d+)$')
      if t then stored, bEnd, bMem, bLvl = tonumber(t), tonumber(e), tonumber(m), tonumber(l) end
    end
  end
  local r, reset = 0, 0 -- the reply: remaining, or -retry; resetAfter
  local write -- the TAT to store, if any
  local gone -- the TAT is to go (the key too, unless it keeps a ban)
  if bMem and bMem <= now then bEnd, bMem, bLvl = nil, nil, nil end
  if not stored then
    redis.call('DEL', key)
    if type(raw) == 'table' then reset = -1 else reset = -2 end
  elseif ban and bEnd and bEnd > now then
    -- Banned: denied until the ban's end, or the rate's own retry time if
    -- later; nothing is consumed.
    local tat = stored
    if tat < now then tat = now end
    local retry = bEnd - now
    local d = tat + cost * T - B * T - now
    if d > retry then retry = d end
    r, reset = -retry, -(8 + 2 * bLvl)
  elseif op == 'r' then
    local tat = stored - cost * T
    if tat > now then
      write, reset = tat, tat - now
    else
      gone = true
    end
  else
    local tat = stored
    if tat < now then tat = now end
    if op == 'c' then
      local cap = now + 2 * B * T -- the debt cap of algorithms.Limit.Charge
      if tat > cap then cap = tat end
      tat = tat + cost * T
      if tat > cap then tat = cap end
      if tat > now then write = tat else gone = true end
      op = 'p' -- reported as a peek reports it afterwards
    end
    if op == 'p' then cost = 1; sC = nil end
    local newTAT = tat + cost * T
    local d = now - (newTAT - B * T) -- now - allowAt
    if d < -ahead or cost > B then -- (a cost over the burst never passes, even later)
      r, reset = d, tat - now -- d < 0: -d is the retry time
      if ban and not peekOnly then -- a denial starts a ban, one level up while remembered
        if bLvl then bLvl = bLvl + 1 else bLvl = 1 end
        local len = bFirst
        if bMax > bFirst then
          for _ = 2, bLvl do
            if len >= bMax then break end
            len = len * 2
          end
          if len > bMax then len = bMax end
          bMem = now + len + bMax
        else
          bMem = now + len
        end
        bEnd = now + len
        if len > -d then r = -len end
        reset = -(9 + 2 * bLvl)
        write = stored
      end
    else
      local q = 0 -- d < 0: admitted for later, nothing left
      if d > 0 then
        q = floor(d / T) -- exactly: the quotient may be one off
        if q * T > d then q = q - 1 elseif (q + 1) * T <= d then q = q + 1 end
      end
      if op == 'p' then
        r, reset = q + 1, tat - now
      else
        r, reset, write = q, newTAT - now, newTAT
      end
    end
  end
  if bMem and (write or gone) then
    -- The key keeps its ban (and what is remembered of it) as its TAT
    -- changes: its TTL reaches the later of the two.
    local w = write
    if not w or w < now then w = 0 end
    local left = bMem - now
    if w - now > left then left = w - now end
    redis.call('SET', key, format('%d,%d,%d,%d', w, bEnd, bMem, bLvl), 'PX', format('%d', floor((left + 999) / 1000)))
  elseif write then -- with a TTL of its resetAfter, rounded up to whole ms, at least 1
    local left = write - now
    local ms = floor(left / 1000) -- the quotient may round up to an integer,
    if ms * 1000 > left then ms = ms - 1 end -- never down: now it is floored,
    if ms * 1000 < left then ms = ms + 1 end -- and now rounded up
    if ms < 1 then ms = 1 end
    if ms ~= lastMs then lastMs, lastPX = ms, format('%d', ms) end
    redis.call('SET', key, format('%d', write), 'PX', lastPX)
  elseif gone then
    redis.call('DEL', key)
  end
  out[j], out[j + 1] = r, reset
end
return out
