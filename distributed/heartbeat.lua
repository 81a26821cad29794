-- One heartbeat: registers an instance in the instances set, a sorted set
-- of id -> the instant its registration ends (ms of Redis TIME, the only
-- clock). Expired ids are dropped; the set gets a TTL like every key.
-- KEYS[1]  the instances set
-- KEYS[2]  the slots' recovery mark (concurrency.lua), in KEYS[1]'s hash slot
-- ARGV[1]  this instance's id
-- ARGV[2]  how long the registration lasts, in ms
-- ARGV[3]  "1" when this instance beat recently: the set must exist unless
--          Redis lost its data (FLUSHALL, a restart without it)
-- ARGV[4]  how long a recovery lasts, in ms
--
-- Returns {live ids, 1 while a recovery is on else 0}. Finding the set gone
-- when it must exist starts a recovery: no one takes a new slot for its
-- length, while every instance takes its lost slots back.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
if ARGV[3] == '1' and redis.call('ZCARD', KEYS[1]) == 0 then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[4], 'NX')
end
redis.call('ZADD', KEYS[1], string.format('%d', now + ttl), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now))
redis.call('PEXPIRE', KEYS[1], ttl)
local recovering = 0
if redis.call('GET', KEYS[2]) then recovering = 1 end
return {redis.call('ZCARD', KEYS[1]), recovering}
