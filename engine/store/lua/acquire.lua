if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local token = redis.call('INCR', KEYS[2])
local value = ARGV[1] .. ':' .. token
redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
return value
