-- KEYS: running zset, waiting members' lease ends (as in slot_take.lua). ARGV: lease ms,
-- then members. Extends the lease of each member still running or waiting; one whose lease
-- ended already stays gone (it takes a new ticket when it asks again).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local until_ms = now + tonumber(ARGV[1])
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], 'XX', until_ms, ARGV[i])
  redis.call('ZADD', KEYS[2], 'XX', until_ms, ARGV[i])
end
return 1
