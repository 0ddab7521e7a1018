-- KEYS: moves, mark, then the sets a listing reads (one sort, one or two scopes), then
--   the scopes' `first` sets (a moved session's membership).
-- ARGV: n sets, mark ('' = a first page: bump the mark; '-' = a sort that never moves),
--   (a first page returns the mark its listing goes on with)
--   order ('desc' | 'asc'), cursor score ('' = from the top), cursor member, count.
-- One partition's share of a listing page, read at one instant: the sessions that moved
-- since the listing's first page (each with where it was then), and up to `count`
-- members of each set after the cursor, those moved left out.
local nsets = tonumber(ARGV[1])
local mark = ARGV[2]
local desc = ARGV[3] == 'desc'
local cscore, cmember = ARGV[4], ARGV[5]
local count = tonumber(ARGV[6])
local moved = {}
local out_moved = {}
if mark == '' then
  local bumped = redis.pcall('INCR', KEYS[2])
  if type(bumped) == 'number' then
    mark = tostring(bumped)
  else
    -- Redis refuses writes (past maxmemory): this listing goes on from the last mark, as
    -- of when it was set: moved sessions where they were then, on every page alike.
    mark = redis.call('GET', KEYS[2]) or '0'
  end
end
if mark ~= '-' and mark ~= '' then
  local want = tonumber(mark)
  local top = '+'
  local done = false
  local batch = 8  -- most pages find the newest entry older than their mark: read few first
  while not done do
    local entries = redis.call('XREVRANGE', KEYS[1], top, '-', 'COUNT', batch)
    if #entries == 0 then break end
    for _, entry in ipairs(entries) do
      local f = {}
      for j = 1, #entry[2], 2 do f[entry[2][j]] = entry[2][j + 1] end
      if tonumber(f['m']) < want then done = true; break end
      moved[f['s']] = {f['l'], f['w']}  -- read newest first: the last kept is the first move
      top = '(' .. entry[1]
    end
    if #entries < batch then break end
    batch = math.min(batch * 4, 512)
  end
  for sid, was in pairs(moved) do
    for k = 3 + nsets, #KEYS do
      if redis.call('ZSCORE', KEYS[k], sid) then
        table.insert(out_moved, {sid, was[1], was[2]})
        break
      end
    end
  end
end
local function lt(a, b)  -- byte by byte, as Redis orders members of equal score
  for j = 1, math.min(#a, #b) do
    local x, y = string.byte(a, j), string.byte(b, j)
    if x ~= y then return x < y end
  end
  return #a < #b
end
local function after(score, member)
  if cscore == '' then return true end
  local s, c = tonumber(score), tonumber(cscore)
  if desc then return s < c or (s == c and lt(member, cmember)) end
  return s > c or (s == c and lt(cmember, member))
end
local out_sets = {}
for k = 3, 2 + nsets do
  local got = {}
  local n = 0
  local offset = 0
  local batch = count + 16
  while n < count do
    local page
    if desc then
      page = redis.call('ZRANGE', KEYS[k], cscore == '' and '+inf' or cscore, '-inf',
        'BYSCORE', 'REV', 'LIMIT', offset, batch, 'WITHSCORES')
    else
      page = redis.call('ZRANGE', KEYS[k], cscore == '' and '-inf' or cscore, '+inf',
        'BYSCORE', 'LIMIT', offset, batch, 'WITHSCORES')
    end
    for j = 1, #page, 2 do
      local member, score = page[j], page[j + 1]
      if n < count and not moved[member] and after(score, member) then
        n = n + 1
        table.insert(got, member)
        table.insert(got, score)
      end
    end
    if #page < batch * 2 then break end
    offset = offset + batch
  end
  table.insert(out_sets, got)
end
return {mark, out_moved, out_sets}
