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
-- Returns 2 integers per key, flat: {r, reset_after_us}. r >= 0: allowed,
-- with r remaining (a refund: 0); r < 0: denied, retry after -r µs (a
-- denial always has a retry time > 0, an allowed step none). reset is -1
-- when the key held a value of another type and -2 when it held a string
-- that is not a TAT: a value tally did not write, deleted instead of
-- decided on (left alone it would deny the key forever or, read as 0, admit
-- it forever, with no TTL). The next step starts the key fresh. Reporting
-- it per key keeps one planted value from failing the other keys of the
-- batch.

-- How it is written (the interface above is all a caller needs):
--
-- Lua numbers are doubles. Microseconds since the epoch and every sum below
-- stay under 2^53, so all values are exact integers; divisions are floored
-- and then corrected by one, which makes them exact. Numbers are written
-- with '%d': a number passed to redis.call is formatted with '%.17g' (exact,
-- but slower in Redis 7.0 than Lua's own '%d').
--
-- Its shape is for what Redis runs, counted in instructions (valgrind
-- --tool=callgrind on redis-server 7.0): one key per call costs 58.0k
-- (go-redis/redis_rate's script: 63.8k), 16 keys per call 27.5k per key (a
-- bare GET and SET ... PX per key: 22.1k). So: one loop and no local
-- functions (each closure, made anew on every call, costs about 1.5k); a
-- batch's keys mostly share a limit, so a limit is parsed (strtod) only
-- when its string differs from the previous key's (interned strings:
-- comparing is free); a TTL is formatted only when it differs from the last
-- one written; the reply table starts sized for one key, and holds two
-- integers per key (four cost 4% more).

local floor, format, tonumber = math.floor, string.format, tonumber

local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local out = {0, 0}
local sT, sB, sC, T, B, cost -- the last limit parsed, as sent and as numbers
local lastMs, lastPX -- the last TTL written, as a number and as sent
for i = 1, #KEYS do
  local key, a, j = KEYS[i], 4 * i - 2, 2 * i - 1
  if ARGV[a] ~= sT then sT = ARGV[a]; T = tonumber(sT) end
  if ARGV[a + 1] ~= sB then sB = ARGV[a + 1]; B = tonumber(sB) end
  if ARGV[a + 2] ~= sC then sC = ARGV[a + 2]; cost = tonumber(sC) end
  local op = ARGV[a + 3]
  local raw = redis.pcall('GET', key)
  local stored = 0
  if raw then
    stored = tonumber(raw) -- nil for an error reply (a table) or a foreign string
  end
  local r, reset = 0, 0 -- the reply: remaining, or -retry; resetAfter
  local write -- the TAT to store, if any
  if not stored then
    redis.call('DEL', key)
    if type(raw) == 'table' then reset = -1 else reset = -2 end
  elseif op == 'r' then
    local tat = stored - cost * T
    if tat > now then
      write, reset = tat, tat - now
    else
      redis.call('DEL', key)
    end
  else
    local tat = stored
    if tat < now then tat = now end
    if op == 'c' then
      local cap = now + 2 * B * T -- the debt cap of algorithms.Limit.Charge
      if tat > cap then cap = tat end
      tat = tat + cost * T
      if tat > cap then tat = cap end
      if tat > now then write = tat else redis.call('DEL', key) end
      op = 'p' -- reported as a peek reports it afterwards
    end
    if op == 'p' then cost = 1; sC = nil end
    local newTAT = tat + cost * T
    local d = now - (newTAT - B * T) -- now - allowAt
    if d < 0 then
      r, reset = d, tat - now -- d < 0: -d is the retry time
    else
      local q = floor(d / T) -- exactly: the quotient may be one off
      if q * T > d then q = q - 1 elseif (q + 1) * T <= d then q = q + 1 end
      if op == 'p' then
        r, reset = q + 1, tat - now
      else
        r, reset, write = q, newTAT - now, newTAT
      end
    end
  end
  if write then -- with a TTL of its resetAfter, rounded up to whole ms, at least 1
    local left = write - now
    local ms = floor(left / 1000) -- the quotient may round up to an integer,
    if ms * 1000 > left then ms = ms - 1 end -- never down: now it is floored,
    if ms * 1000 < left then ms = ms + 1 end -- and now rounded up
    if ms < 1 then ms = 1 end
    if ms ~= lastMs then lastMs, lastPX = ms, format('%d', ms) end
    redis.call('SET', key, format('%d', write), 'PX', lastPX)
  end
  out[j], out[j + 1] = r, reset
end
return out
