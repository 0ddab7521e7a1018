-- KEYS: running zset (member -> lease end, ms), waiting zset (member -> ticket), waiting
-- members' lease ends (zset), ticket counter. ARGV: member, limit, lease ms.
-- Returns {1, 0, 0} when the member runs (now, or already), else {0, ticket, ahead}: it
-- waits, `ahead` turns before it in ticket order. Members whose lease ended (their process
-- died) are dropped first, so a crashed holder frees its slot within one lease.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local member, limit, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)) do
  redis.call('ZREM', KEYS[2], gone)
  redis.call('ZREM', KEYS[3], gone)
end
if redis.call('ZSCORE', KEYS[1], member) then
  redis.call('ZADD', KEYS[1], now + lease, member)
  return {1, 0, 0}
end
local ticket = redis.call('ZSCORE', KEYS[2], member)
if not ticket then
  ticket = redis.call('INCR', KEYS[4])
  redis.call('ZADD', KEYS[2], ticket, member)
end
local rank = redis.call('ZRANK', KEYS[2], member)
if rank < limit - redis.call('ZCARD', KEYS[1]) then
  redis.call('ZREM', KEYS[2], member)
  redis.call('ZREM', KEYS[3], member)
  redis.call('ZADD', KEYS[1], now + lease, member)
  return {1, 0, 0}
end
redis.call('ZADD', KEYS[3], now + lease, member)
return {0, tonumber(ticket), rank}
