-- GCRA steps on any number of keys, atomically: the Lua twin of
-- algorithms.Limit (Decide, Refund, Peek, Charge). tests/store_test.go runs
-- both on the same table of cases, one key per call and all in one call, and
-- requires identical results, stored TAT and TTL.
--
-- One call decides a whole batch: one dispatch, one TIME, one reply. On
-- Redis Cluster every key of a call is in one hash slot (the batcher groups
-- them so). A key may appear more than once; its steps apply in order.
--
-- KEYS[i]        the i-th key; its value is the TAT in integer microseconds
-- ARGV[1]        now in microseconds, or "" to use Redis TIME (production:
--                the server's clock is the only clock, so instances need
--                not agree)
-- ARGV[4i-2..4i+1]  the i-th key's step:
--   T     emission interval in microseconds (>= 1)
--   B     burst in units of cost (>= 1)
--   cost
--   op    "d" decide, "r" refund, "p" peek, "c" charge (after the
--         response: the TAT moves on by cost*T whatever the burst, and the
--         key is reported as peek would report it afterwards)
--
-- Returns 4 integers per key, flat: {allowed (0|1), remaining,
-- retry_after_us, reset_after_us}. allowed is -1 when the key held a value
-- of another type and -2 when it held a string that is not a TAT: a value
-- tally did not write, deleted instead of decided on (left alone it would
-- deny the key forever or, read as 0, admit it forever, with no TTL). The
-- next step starts the key fresh. Reporting it per key keeps one planted
-- value from failing the other keys of the batch.
--
-- Lua numbers are doubles. Microseconds since the epoch and every sum below
-- stay under 2^53, so all values are exact integers; divisions are floored
-- and then corrected by one, which makes them exact. Numbers are written
-- with '%d': a number passed to redis.call is formatted with '%.17g' (exact,
-- but slower in Redis 7.0 than Lua's own '%d').
--
-- Cost, counted in instructions Redis runs (valgrind --tool=callgrind on
-- redis-server 7.0, 16 keys per call: 36.0k per key before, 29.1k now;
-- a bare GET and SET ... PX per key is 22.1k): the allowed decision, the hot
-- path, is inline in the loop (no function call per key); a batch's keys
-- mostly share a limit, so a limit is parsed (strtod) only when its string
-- differs from the previous key's (interned strings: comparing is free), and
-- a TTL is formatted only when it differs from the last one written.

local floor, format, tonumber = math.floor, string.format, tonumber

local lastMs, lastPX -- the last TTL written, as a number and as sent
local function ttl(left) -- resetAfter rounded up to whole ms, at least 1
  local ms = floor(left / 1000) -- the quotient may round up to an integer,
  if ms * 1000 > left then ms = ms - 1 end -- never down: now it is floored,
  if ms * 1000 < left then ms = ms + 1 end -- and now rounded up
  if ms < 1 then ms = 1 end
  if ms ~= lastMs then lastMs, lastPX = ms, format('%d', ms) end
  return lastPX
end

local function idiv(a, b) -- floor(a / b) for a >= 0, b > 0, exactly
  local q = floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

-- other runs the steps other than an allowed decision: refund, peek,
-- charge, and a denied decision. tat is the stored TAT (0 if absent).
local function other(key, tat, T, B, cost, op, now)
  if op == 'r' then
    tat = tat - cost * T
    if tat <= now then
      redis.call('DEL', key)
      return 1, 0, 0, 0
    end
    redis.call('SET', key, format('%d', tat), 'PX', ttl(tat - now))
    return 1, 0, 0, tat - now
  end
  if tat < now then tat = now end
  if op == 'c' then
    local cap = now + 2 * B * T -- the debt cap of algorithms.Limit.Charge
    if tat > cap then cap = tat end
    tat = tat + cost * T
    if tat > cap then tat = cap end
    if tat > now then
      redis.call('SET', key, format('%d', tat), 'PX', ttl(tat - now))
    else
      redis.call('DEL', key)
    end
    op = 'p'
  end
  if op == 'p' then cost = 1 end
  local allowAt = tat + cost * T - B * T
  if allowAt > now then
    return 0, 0, allowAt - now, tat - now
  end
  return 1, idiv(now - allowAt, T) + 1, 0, tat - now -- a peek (a decision allowed is inline)
end

local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local out = {}
local sT, sB, sC, T, B, cost -- the last limit parsed, as sent and as numbers
for i = 1, #KEYS do
  local key, a, j = KEYS[i], 4 * i - 2, 4 * i - 3
  if ARGV[a] ~= sT then sT = ARGV[a]; T = tonumber(sT) end
  if ARGV[a + 1] ~= sB then sB = ARGV[a + 1]; B = tonumber(sB) end
  if ARGV[a + 2] ~= sC then sC = ARGV[a + 2]; cost = tonumber(sC) end
  local op = ARGV[a + 3]
  local raw = redis.pcall('GET', key)
  local stored = 0
  if raw then
    stored = tonumber(raw) -- nil for an error reply (a table) or a foreign string
  end
  if not stored then
    redis.call('DEL', key)
    out[j], out[j + 1], out[j + 2], out[j + 3] = type(raw) == 'table' and -1 or -2, 0, 0, 0
  else
    local tat = stored
    if tat < now then tat = now end
    local newTAT = tat + cost * T
    local d = now - (newTAT - B * T) -- now - allowAt
    if op == 'd' and d >= 0 then
      local left = newTAT - now
      redis.call('SET', key, format('%d', newTAT), 'PX', ttl(left))
      local q = floor(d / T)
      if q * T > d then q = q - 1 elseif (q + 1) * T <= d then q = q + 1 end
      out[j], out[j + 1], out[j + 2], out[j + 3] = 1, q, 0, left
    else
      out[j], out[j + 1], out[j + 2], out[j + 3] = other(key, stored, T, B, cost, op, now)
    end
  end
end
return out
