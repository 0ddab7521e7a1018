-- KEYS: snap, then (first, last, wake) per scope. ARGV: seq the caller read, session id,
--   created ms, last-event ms, wake ms ('' = none), scopes.
-- Indexes a session written before the listing indexes existed (or restored from an
-- archive), only as the caller read it: a commit in between moves its seq (0: read it
-- again), and a commit of this version indexes it itself (1: nothing to do).
local cur = tonumber(redis.call('HGET', KEYS[1], 'seq') or '0')
if cur ~= tonumber(ARGV[1]) then return 0 end
if redis.call('HGET', KEYS[1], 'ix') then return 1 end
redis.call('HSET', KEYS[1], 'ix', ARGV[6])
for k = 2, #KEYS, 3 do
  redis.call('ZADD', KEYS[k], 'NX', ARGV[3], ARGV[2])
  redis.call('ZADD', KEYS[k + 1], ARGV[4], ARGV[2])
  if ARGV[5] ~= '' then redis.call('ZADD', KEYS[k + 2], ARGV[5], ARGV[2]) end
end
return 1
