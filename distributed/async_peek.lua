-- An async-mode key as Redis holds it, for the admin API: its TAT and
-- Redis's clock, both in microseconds, so that the caller computes the
-- key's state with algorithms.Limit.Peek (async.lua writes the hash).
--
-- KEYS[1]  the key: a hash {t = TAT µs, ...} (see async.lua), or absent
--
-- Returns {now_us, tat_us}; tat_us is 0 for an absent key.

local t = redis.call('TIME')
return {tonumber(t[1]) * 1000000 + tonumber(t[2]), tonumber(redis.call('HGET', KEYS[1], 't')) or 0}
