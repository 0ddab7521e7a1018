-- KEYS: turns hash, lease key. ARGV: field, owner, JSON (absent: delete the checkpoint and
-- the lease). Writes only under the owner's lease: a follower that lost it changes nothing.
if redis.call('GET', KEYS[2]) ~= ARGV[2] then return 0 end
if ARGV[3] then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
else
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('DEL', KEYS[2])
end
return 1
