-- KEYS: snap, log, deltas, files, sessions, inflight, work, then the session's listing
--   indexes. ARGV: expected seq, session id,
--   the work stream's longest length this script scans, `"sid":"<id>"` as a work entry
--   spells it.
-- Removes a session only as the sweep saw it: its snapshot still at the seq the sweep
-- read (a commit in between moves it), no call in flight, and no input for it waiting
-- on the partition's work stream (a turn submitted mid-sweep runs on the session as it
-- was). All in one script, on the session's slot: nothing half-deleted is ever visible.
local cur = tonumber(redis.call('HGET', KEYS[1], 'seq') or '0')
if cur ~= tonumber(ARGV[1]) or cur == 0 then return 0 end
if redis.call('SISMEMBER', KEYS[6], ARGV[2]) == 1 then return -1 end
local limit = tonumber(ARGV[3])
if redis.call('EXISTS', KEYS[7]) == 1 then
  if redis.call('XLEN', KEYS[7]) > limit then return -2 end
  local needle = ARGV[4]
  for _, entry in ipairs(redis.call('XRANGE', KEYS[7], '-', '+')) do
    local fields = entry[2]
    for i = 2, #fields, 2 do
      if string.find(fields[i], needle, 1, true) then return -3 end
    end
  end
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
redis.call('ZREM', KEYS[5], ARGV[2])
for k = 8, #KEYS do redis.call('ZREM', KEYS[k], ARGV[2]) end
return 1
