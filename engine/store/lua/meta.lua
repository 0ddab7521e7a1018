-- KEYS: the meta hash. ARGV: partitions wanted, tag scheme for a new store.
-- The first engine on this Redis fixes the partition count and the partitions' hash tags;
-- a store from before tags were spread has a count and no scheme (plain `{p}` tags).
if redis.call('HSETNX', KEYS[1], 'partitions', ARGV[1]) == 1 then
  redis.call('HSET', KEYS[1], 'tags', ARGV[2])
end
return redis.call('HMGET', KEYS[1], 'partitions', 'tags')
