-- One async-mode sync of one key, atomically (see async.go for the scheme and
-- its bound). The instance reports what it did since its last sync and takes
-- a lease: tokens reserved for it in the fleet's GCRA state, which it may
-- admit locally until its next sync.
--
-- KEYS[1]  the key: a hash {t = TAT µs, c = episode start µs, m:<id> = 1 ...}
-- ARGV[1]  T, emission interval in microseconds (>= 1)
-- ARGV[2]  B, burst in units of cost (>= 1)
-- ARGV[3]  N, live instances as this instance last saw them (>= 1)
-- ARGV[4]  delta: cost admitted and not yet counted, minus the unused lease
--          handed back (may be negative)
-- ARGV[5]  idle: 1 when the instance admitted nothing since its last sync:
--          its lease is at most ⌈spare/N²⌉, and none when the key is full
--          (the instance then forgets the key)
-- ARGV[6]  hold, µs: how long after an episode starts instances may still
--          hold unreported fresh shares (2 sync intervals plus 2 sync time bounds, at least 1s)
-- ARGV[7]  fresh: the share an instance admits for a key it has never synced
-- ARGV[8]  take: 1 to take a lease, 0 to only report (closing)
-- ARGV[9]  the instance id
-- ARGV[10] the report's sequence number: a report whose reply was lost is
--          sent again with the same number, and gets the lease it was
--          granted back instead of being applied twice
--
-- Returns {lease, avail, retry_us, reset_us}: the tokens now reserved for
-- the instance, the fleet's tokens left after that (<= B, may be negative),
-- how long until one more token is back (0 when avail >= 1), and how long
-- until the key is back to full (its TTL).
--
-- An episode starts when a key with no outstanding reservation (TAT <= now)
-- is written. For `hold` after that, instances that have not yet reported
-- the key may each be admitting a fresh share no one has counted, so the
-- lease leaves that much aside: this is what keeps a burst that reaches
-- every instance at once within the limit.
--
-- Numbers are written with '%d' (redis.call would use '%.14g' and lose
-- digits); µs since the epoch and every sum stay below 2^53.

local function idiv(a, b) -- floor(a / b) for b > 0, exactly
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

local key = KEYS[1]
local T = tonumber(ARGV[1])
local B = tonumber(ARGV[2])
local N = tonumber(ARGV[3])
local delta = tonumber(ARGV[4])
local idle = ARGV[5] == '1'
local hold = tonumber(ARGV[6])
local fresh = tonumber(ARGV[7])
local take = ARGV[8] == '1'
local id = ARGV[9]
local seq = ARGV[10]

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- A value tally did not write is deleted and reported (see gcra.lua); the
-- report is sent again by the next sync, on a fresh key.
local v = redis.pcall('HMGET', key, 't', 'c', 'm:' .. id)
if v.err then
  redis.call('DEL', key)
  return redis.error_reply('TALLYFOREIGN a value of another type was at a tally key; deleted')
end
local tat = tonumber(v[1]) or 0
local created = tonumber(v[2]) or 0

-- m:<id> holds "<seq> <lease>" of this instance's last applied report.
if v[3] then
  local done, granted = string.match(v[3], '^(%d+) (%d+)$')
  if done == seq then
    -- Applied already; the reply was lost. Grant the same lease again,
    -- and report the key as it stands now.
    local cur = tat
    if cur < now then cur = now end
    local avail = idiv(now + B * T - cur, T)
    local retry = 0
    if avail < 1 then retry = cur - B * T + T - now end
    return {tonumber(granted), avail, retry, cur - now}
  end
end
if tat <= now then
  -- Nothing outstanding: a new episode, with no instance known yet.
  redis.call('DEL', key)
  tat = now
  created = now
end

-- Already admitted: counted even beyond the burst (the key goes into debt).
tat = tat + delta * T
if tat < now then tat = now end
local avail = idiv(now + B * T - tat, T)

local spare = avail
if now - created < hold then
  redis.call('HSET', key, 'm:' .. id, '1', 't', string.format('%d', tat), 'c', string.format('%d', created))
  local known = redis.call('HLEN', key) - 2
  if known < N then spare = avail - (N - known) * fresh end
end

local lease = 0
if take and spare >= 1 and not (idle and avail >= B) then
  lease = idiv(spare + N - 1, N) -- ceil: reserved, so rounding up takes nothing twice
  if idle then
    -- No traffic here: park a small lease, 1/N of a share (at least one
    -- token), so that the idle instances together hold at most 1/N of
    -- what is left, and a burst after a quiet spell is not denied until
    -- the next sync (one token was too few: 0.5-4% spurious 429s for keys
    -- at 2% of their limit).
    local small = idiv(spare + N * N - 1, N * N)
    if small < 1 then small = 1 end
    if lease > small then lease = small end
  end
end
tat = tat + lease * T
avail = avail - lease

if tat <= now then
  redis.call('DEL', key)
  return {lease, avail, 0, 0}
end
local ms = idiv(tat - now + 999, 1000)
redis.call('HSET', key, 't', string.format('%d', tat), 'c', string.format('%d', created),
  'm:' .. id, seq .. ' ' .. string.format('%d', lease))
redis.call('PEXPIRE', key, string.format('%d', ms))
local retry = 0
if avail < 1 then retry = tat - B * T + T - now end
return {lease, avail, retry, tat - now}
