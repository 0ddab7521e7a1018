-- KEYS: snap, log, sessions, files. ARGV: session id, seq, snapshot state, created ms,
--   n_files, (digest, bytes)*, then (id, event)* for the whole log.
-- Puts an archived session back, all of it or nothing: refused (0) while any key of a
-- session with that id exists, so a restore never mixes two sessions' logs.
if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local i = 6
for _ = 1, tonumber(ARGV[5]) do
  redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1])
  i = i + 2
end
for j = i, #ARGV, 2 do
  redis.call('XADD', KEYS[2], ARGV[j], 'e', ARGV[j + 1])
end
redis.call('HSET', KEYS[1], 'seq', ARGV[2], 'state', ARGV[3], 'at', ARGV[2])
redis.call('ZADD', KEYS[3], 'NX', ARGV[4], ARGV[1])
return 1
