-- KEYS: snap, log, deltas, sessions, inflight, files, then the session's listing indexes.
-- ARGV: expected seq, session id.
-- Deletes only while the snapshot is still at the seq the caller checked: a commit in
-- between (a turn that started) moves it, and the caller reads the session again.
local cur = tonumber(redis.call('HGET', KEYS[1], 'seq') or '0')
if cur ~= tonumber(ARGV[1]) then return 0 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[6])
redis.call('ZREM', KEYS[4], ARGV[2])
redis.call('SREM', KEYS[5], ARGV[2])
for k = 7, #KEYS do redis.call('ZREM', KEYS[k], ARGV[2]) end
return 1
