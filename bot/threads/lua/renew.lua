-- KEYS: lease key. ARGV: owner, ttl ms. Renews only a lease the owner still holds.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
