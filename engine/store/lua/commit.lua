-- KEYS: log, snap, work, inflight, lease, timers, reply, outbox, sessions, dead, then
--       for the listing indexes (engine/store/index.py) moves, mark and (first, last,
--       wake) per scope
-- ARGV: lease_value, expected_seq, new_seq, snapshot ('' = not rewritten), ack_id,
--       inflight (+/-/''), session_id, reply ('' = none), n_events, created_ms ('' = not
--       new), dead letter ('' = none), (id, json)*, n_timers, (score, member)*,
--       n_timer_removals, member*, n_outbox, item*, then for the indexes: created ms,
--       last-event ms ('' = no index write), wake ms ('' = none), now ms, scopes
if redis.call('GET', KEYS[5]) ~= ARGV[1] then return -1 end
-- the snapshot hash's seq, and its index fields (read here in the same command: nothing
-- below writes them before the index part reads them)
local snap = redis.call('HMGET', KEYS[2], 'seq', 'ix', 'ixm')
local cur = tonumber(snap[1] or '0')
if cur ~= tonumber(ARGV[2]) then return -2 end
if ARGV[10] ~= '' then redis.call('ZADD', KEYS[9], 'NX', ARGV[10], ARGV[7]) end
if ARGV[11] ~= '' then redis.call('XADD', KEYS[10], 'MAXLEN', '~', 10000, '*', 'd', ARGV[11]) end
local i = 12
local n = tonumber(ARGV[9])
for _ = 1, n do
  redis.call('XADD', KEYS[1], ARGV[i], 'e', ARGV[i + 1])
  i = i + 2
end
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[2], 'seq', ARGV[3], 'state', ARGV[4], 'at', ARGV[3])
elseif n > 0 then
  redis.call('HSETNX', KEYS[2], 'at', cur)
  redis.call('HSET', KEYS[2], 'seq', ARGV[3])
end
if ARGV[5] ~= '' then
  redis.call('XACK', KEYS[3], 'engine', ARGV[5])
  redis.call('XDEL', KEYS[3], ARGV[5])
end
if ARGV[6] == '+' then redis.call('SADD', KEYS[4], ARGV[7])
elseif ARGV[6] == '-' then redis.call('SREM', KEYS[4], ARGV[7]) end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  redis.call('ZADD', KEYS[6], ARGV[i], ARGV[i + 1])
  i = i + 2
end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  redis.call('ZREM', KEYS[6], ARGV[i])
  i = i + 1
end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  redis.call('XADD', KEYS[8], '*', 'm', ARGV[i])
  i = i + 1
end
if #KEYS > 12 and ARGV[i + 1] ~= '' then
  local sid, last, wake = ARGV[7], ARGV[i + 1], ARGV[i + 2]
  -- a move: where it was is kept once per listing started since (the mark). The mark is
  -- read first: once this session's move is kept for it (`ixm`), its scores need no read.
  local mark = redis.call('GET', KEYS[12]) or '0'
  if snap[3] ~= mark then
    local old_last = redis.call('ZSCORE', KEYS[14], sid)
    local old_wake = redis.call('ZSCORE', KEYS[15], sid)
    local wake_was = old_wake and tonumber(old_wake) or -1
    local wake_is = wake ~= '' and tonumber(wake) or -1
    if old_last and (tonumber(old_last) ~= tonumber(last) or wake_was ~= wake_is) then
      redis.call('XADD', KEYS[11], 'MINID', '~', tonumber(ARGV[i + 3]) - 3600000, '*',
        's', sid, 'm', mark, 'l', old_last, 'w', old_wake or '')
      redis.call('HSET', KEYS[2], 'ixm', mark)
    end
  end
  local fresh = not snap[2]
  if fresh then redis.call('HSET', KEYS[2], 'ix', ARGV[i + 4]) end
  for k = 13, #KEYS, 3 do
    if fresh then redis.call('ZADD', KEYS[k], 'NX', ARGV[i], sid) end
    redis.call('ZADD', KEYS[k + 1], last, sid)
    if wake ~= '' then redis.call('ZADD', KEYS[k + 2], wake, sid)
    else redis.call('ZREM', KEYS[k + 2], sid) end
  end
end
if ARGV[8] ~= '' then
  redis.call('RPUSH', KEYS[7], ARGV[8])
  redis.call('PEXPIRE', KEYS[7], 60000)
end
return tonumber(ARGV[3])
