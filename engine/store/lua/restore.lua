-- KEYS: snap, log, sessions. ARGV: session id, seq, snapshot state, created ms, then
--   (id, event)* for the whole log.
-- Puts an archived session back, all of it or nothing: refused (0) while any key of a
-- session with that id exists, so a restore never mixes two sessions' logs.
if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
for i = 5, #ARGV, 2 do
  redis.call('XADD', KEYS[2], ARGV[i], 'e', ARGV[i + 1])
end
redis.call('HSET', KEYS[1], 'seq', ARGV[2], 'state', ARGV[3], 'at', ARGV[2])
redis.call('ZADD', KEYS[3], 'NX', ARGV[4], ARGV[1])
return 1
