-- KEYS: turns hash, lease key. ARGV: field, owner, lease ms. The checkpoint as it is now,
-- leased to the owner; nil when it is gone (finished) or another follower holds it.
local cp = redis.call('HGET', KEYS[1], ARGV[1])
if not cp then return nil end
if not redis.call('SET', KEYS[2], ARGV[2], 'NX', 'PX', ARGV[3]) then return nil end
return cp
