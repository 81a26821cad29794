-- One heartbeat: registers an instance in the instances set, a sorted set
-- of instance id -> the instant its registration ends, in milliseconds of
-- Redis TIME (the only clock). Expired ids are dropped, and the set itself
-- gets a TTL (the store writes no key without one).
--
-- KEYS[1]  the instances set
-- ARGV[1]  this instance's id
-- ARGV[2]  how long the registration lasts, in ms
--
-- Returns the number of live ids.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], string.format('%d', now + ttl), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now))
redis.call('PEXPIRE', KEYS[1], ttl)
return redis.call('ZCARD', KEYS[1])
