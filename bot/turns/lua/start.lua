-- KEYS: turns hash, lease key, then the dedupe keys. ARGV: field, checkpoint JSON, owner,
-- lease ms, dedupe ttl s. The input is seen, its turn recorded and its follower leased, or
-- (any dedupe key already set, or the turn already recorded) none of them.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 0 end
for i = 3, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then return 0 end
end
for i = 3, #KEYS do redis.call('SET', KEYS[i], 1, 'EX', ARGV[5]) end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
return 1
