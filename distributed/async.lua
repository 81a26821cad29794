-- One async-mode sync of many keys of one hash slot, atomically
-- (docs/async.md): for each key the instance reports what it did since the
-- key's last sync and takes a lease, tokens reserved for it in the fleet's
-- GCRA state, which it may admit locally until the key's next sync.
--
-- KEYS[i]  a key: a hash {t = TAT µs, c = episode start µs, m:<id> = ...}
-- KEYS[#KEYS]  the slot's epoch key: Redis's data generation, written when
--          missing; another than the instance knew means Redis lost its data
-- ARGV[1]  N, live instances as this instance last saw them (>= 1)
-- ARGV[2]  hold, µs: how long after an episode starts instances may still
--          hold unreported fresh shares (2 sync intervals plus 2 sync time
--          bounds, at least 1s)
-- ARGV[3]  the instance id
-- ARGV[4]  the epoch this instance last saw (0: none yet)
-- then 9 per key, key i's at ARGV[4 + 9(i-1) + 1 ...]:
--   T      emission interval in microseconds (>= 1)
--   B      burst in units of cost (>= 1)
--   delta  cost admitted and not yet counted, minus the unused lease handed
--          back (may be negative)
--   idle   1 when the instance admitted nothing since its last look: its
--          lease is at most ⌈spare/N²⌉, none when the key is full
--   fresh  the share an instance admits for a key it has never synced
--   take   1 to take a lease, 0 to only report (closing, or going dormant)
--   seq    the report's sequence number: a report sent again gets the
--          lease it was granted back instead of being applied twice
--   floor  µs: the key's time to full as this instance last heard
--   restore 1 when this instance knows Redis lost its data and has not
--          restored this key yet
--
-- When Redis lost its data or restore is set, a key's TAT is restored to at
-- least now + floor first: a blank Redis is not a full one, and the key ends
-- at the latest of the instances' views. For a hold from the first restore
-- (field r) no lease is handed out, none coming from a part another
-- instance has not restored yet.
--
-- Returns 4 integers per key, then the epoch: {lease, avail, retry_us,
-- reset_us}: the tokens now reserved for the instance, the fleet's left
-- after that (<= B, may be negative), the time until one more is back (0
-- when avail >= 1), and until the key is full (its TTL). A key holding a
-- value tally did not write is deleted and answered {-1, 0, 0, 0}.
--
-- An episode starts when a key with no outstanding reservation is written.
-- For `hold` after that, instances that have not reported the key may each
-- be admitting an uncounted fresh share, which the lease leaves aside: a
-- burst that reaches every instance at once stays within the limit.
--
-- Numbers are written with '%d' ('%.14g' would lose digits); µs since the
-- epoch and every sum stay below 2^53.

local function idiv(a, b) -- floor(a / b) for b > 0, exactly
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

local N = tonumber(ARGV[1])
local hold = tonumber(ARGV[2])
local mine = 'm:' .. ARGV[3]
local knownEpoch = ARGV[4]

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local epochKey = KEYS[#KEYS]
local epoch = redis.call('GET', epochKey)
if not epoch then
  epoch = string.format('%d', now)
  redis.call('SET', epochKey, epoch)
end
redis.call('PEXPIRE', epochKey, 7 * 86400 * 1000)
local lost = knownEpoch ~= '0' and knownEpoch ~= epoch

local out = {}

local function sync(key, T, B, delta, idle, fresh, take, seq, floor, restore)
  local v = redis.pcall('HMGET', key, 't', 'c', mine, 'r')
  if v.err then
    redis.call('DEL', key)
    return -1, 0, 0, 0
  end
  local tat = tonumber(v[1]) or 0
  local created = tonumber(v[2]) or 0

  -- m:<id> holds "<seq> <lease>" of this instance's last applied report.
  local known = v[3]
  if known then
    local done, granted = string.match(known, '^(%d+) (%d+)$')
    if done == seq then
      -- Applied already; the reply was lost. Grant the same lease again,
      -- and report the key as it stands now.
      local cur = math.max(tat, now)
      local avail = idiv(now + B * T - cur, T)
      local retry = 0
      if avail < 1 then retry = cur - B * T + T - now end
      return tonumber(granted), avail, retry, cur - now
    end
  end
  local fields = 0 -- fields of the hash as it stands (0 when it is gone)
  -- r: until when the key is being restored after Redis lost its data.
  local restoring = tonumber(v[4]) or 0
  if lost or restore then
    if tat < now + floor then
      -- Redis lost the key: it stands at least where this instance last
      -- heard, not at full.
      tat = now + floor
      if created == 0 then created = now - hold end
    end
    if restoring == 0 then restoring = now + hold end
  end
  if restoring <= now then restoring = 0 end
  if tat <= now then
    -- Nothing outstanding: a new episode, with no instance known yet.
    if v[1] or v[2] or known then redis.call('DEL', key) end
    tat = now
    created = now
    known = nil
  elseif now - created < hold then
    fields = redis.call('HLEN', key)
  end

  -- Already admitted: counted even beyond the burst (the key goes into debt).
  tat = math.max(tat + delta * T, now)
  local avail = idiv(now + B * T - tat, T)

  local spare = avail
  if now - created < hold then
    -- Instances that reported the key this episode: its m:<id> fields
    -- (the hash's fields but t and c), and this one.
    local reported = 1
    if fields > 0 then
      reported = fields - 2
      if v[4] then reported = reported - 1 end
      if not known then reported = reported + 1 end
    end
    if reported < N then spare = avail - (N - reported) * fresh end
  end

  local lease = 0 -- none while the key is restored (see the header)
  if take and spare >= 1 and not (idle and avail >= B) and restoring == 0 then
    lease = idiv(spare + N - 1, N) -- ceil: reserved, so rounding up takes nothing twice
    if idle then
      -- No traffic here: park 1/N of a share (at least one token): the
      -- idle instances hold at most 1/N of what is left, and a burst after
      -- a quiet spell is not denied until the next sync.
      lease = math.min(lease, math.max(1, idiv(spare + N * N - 1, N * N)))
    end
  end
  tat = tat + lease * T
  avail = avail - lease

  if tat <= now then
    redis.call('DEL', key)
    return lease, avail, 0, 0
  end
  redis.call('HSET', key, 't', string.format('%d', tat), 'c', string.format('%d', created),
    mine, seq .. ' ' .. string.format('%d', lease))
  if restoring > 0 then
    redis.call('HSET', key, 'r', string.format('%d', restoring))
  elseif v[4] then
    redis.call('HDEL', key, 'r')
  end
  redis.call('PEXPIRE', key, string.format('%d', idiv(tat - now + 999, 1000)))
  local retry = 0
  if avail < 1 then retry = tat - B * T + T - now end
  return lease, avail, retry, tat - now
end

for i = 1, #KEYS - 1 do
  local a = 4 + 9 * (i - 1)
  out[4 * i - 3], out[4 * i - 2], out[4 * i - 1], out[4 * i] = sync(KEYS[i], tonumber(ARGV[a + 1]),
    tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), ARGV[a + 4] == '1', tonumber(ARGV[a + 5]), ARGV[a + 6] == '1',
    ARGV[a + 7], tonumber(ARGV[a + 8]), ARGV[a + 9] == '1')
end
out[4 * (#KEYS - 1) + 1] = tonumber(epoch)
return out
