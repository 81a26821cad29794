-- Concurrency slots of one key, atomically: a sorted set of slot id -> the
-- instant its lease ends, in milliseconds of Redis TIME (the only clock).
-- Expired members are dropped before anything is counted, so the slots of a
-- crashed instance free themselves. Every write sets the key's TTL to the
-- latest lease it holds: the key never outlives its slots.
--
-- KEYS[1]  the key's sorted set
-- ARGV[1]  op:
--   "a" acquire: ARGV[2] limit, ARGV[3] lease ms, ARGV[4] slot id,
--       ARGV[5] the key prefix when the instances set (<prefix>instances)
--       must exist, as this instance beat recently; else "" (always on a
--       Cluster, where the set lives on another node)
--       -> {1, slots in use after} or {0, slots in use}. Refused while
--       Redis is found to have lost its data: the instances set gone, or
--       a recovery on (heartbeat.lua marks it when it finds the set gone),
--       during which every instance takes back the slots of its requests
--       still running before anyone takes a new one.
--   "r" renew: ARGV[2] lease ms, ARGV[3] limit, ARGV[4..] slot ids of this
--       instance -> {slots renewed, slots in use after}. A slot the set lost
--       (Redis restarted empty, or the lease ended while this instance could
--       not renew it) is taken again if there is room, so a request still
--       running is counted again; without room it stays gone.
--   "p" peek -> {0, slots in use}

local key = KEYS[1]
local op = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function expire() -- TTL = the latest lease in the set
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('PEXPIRE', key, string.format('%d', math.max(1, tonumber(last[2]) - now)))
  end
end

redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now))
local n = redis.call('ZCARD', key)

if op == 'a' then
  if n >= tonumber(ARGV[2]) then
    return {0, n}
  end
  local prefix = ARGV[5]
  if prefix ~= '' and (redis.call('ZCARD', prefix .. 'instances') == 0 or
      redis.call('GET', prefix .. '{' .. prefix .. 'instances}slots-recovery')) then
    return {0, n}
  end
  redis.call('ZADD', key, string.format('%d', now + tonumber(ARGV[3])), ARGV[4])
  expire()
  return {1, n + 1}
end

if op == 'r' then
  local until_ = string.format('%d', now + tonumber(ARGV[2]))
  local limit = tonumber(ARGV[3])
  local renewed = 0
  for i = 4, #ARGV do
    local held = redis.call('ZSCORE', key, ARGV[i])
    if held or n < limit then
      redis.call('ZADD', key, until_, ARGV[i])
      renewed = renewed + 1
      if not held then n = n + 1 end
    end
  end
  if renewed > 0 then expire() end
  return {renewed, n}
end

return {0, n}
