-- One settled model call's usage added to one budget-policy bucket, once (engine/store/buckets.py).
-- KEYS: use (hash: sub-bucket index -> units, and `_`-prefixed facts of the bucket),
--       seen (zset: the charge ids counted in the window, scored by when they happened)
-- ARGV: charge id, at_ms, now_ms, slot_ms, slots, amount, policy, group, dimension, limit,
--       window_ms
-- Returns 1 when counted, 0 when already counted or already out of the window.
local at, now = tonumber(ARGV[2]), tonumber(ARGV[3])
local slot_ms, slots = tonumber(ARGV[4]), tonumber(ARGV[5])
local now_slot = math.floor(now / slot_ms)
local first = now_slot - slots + 1
local slot = math.floor(at / slot_ms)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. string.format('%d', first * slot_ms))
if slot < first then return 0 end
if redis.call('ZADD', KEYS[2], 'NX', ARGV[2], ARGV[1]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[1], string.format('%d', slot), ARGV[6])
redis.call('HSET', KEYS[1], '_policy', ARGV[7], '_group', ARGV[8], '_dimension', ARGV[9],
  '_limit', ARGV[10], '_window_ms', ARGV[11], '_slot_ms', ARGV[4])
for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
  local n = tonumber(field)
  if n and n < first then redis.call('HDEL', KEYS[1], field) end
end
-- Both keys live until the newest sub-bucket leaves the window.
local ttl = (math.max(slot, now_slot) + slots) * slot_ms - now
local cur = redis.call('PTTL', KEYS[1])
if cur > ttl then ttl = cur end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return 1
