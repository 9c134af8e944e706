-- sliding_log: every counted hit with its timestamp. Exact: at any instant, the hits of the
-- last window never exceed the limit (unless the limit overshoots, when they are all
-- counted). The Lua twin of src/limiter/sliding_log.rs.
--
-- State, two keys with the counter key's hash tag (so one cluster slot), both expiring one
-- window after the newest hit (script.rs: `log_keys`):
--   key .. ':log'  sorted set, one member per distinct timestamp, scored by it and named
--                  `<timestamp>:<hits>`: the hits of one instant share one member, whatever
--                  they cost, so memory grows with distinct timestamps, not with hits;
--   key .. ':n'    the hits the log holds, so that no call sums the whole log.

-- The most hits a log holds (the Rust twin's MAX_TOTAL): an overshooting charge past it
-- counts only up to it, as a sliding window's count saturates.
local LOG_MAX_TOTAL = 4294967295

-- The most members one ZRANGEBYSCORE reads while looking for the entry whose exit brings a
-- unit back: the first read takes one (the oldest, all a log within its limit needs), each
-- next one twice as many.
local LOG_BATCH = 512

local function log_keys(key)
  return key .. ':log', key .. ':n'
end

-- A member's name. `..` writes a number with 14 significant digits: enough for the hits
-- (at most 2^32), not for a timestamp in µs.
local function log_member(at, hits)
  return int(at) .. ':' .. hits
end

local function hits_of(member)
  return tonumber(string.match(member, ':(%d+)$'))
end

-- The newest entry's timestamp, hits and member, nil if the log is empty.
local function newest_entry(call, log)
  local entry = call('ZRANGE', log, -1, -1, 'WITHSCORES')
  if entry[1] == nil then
    return nil
  end
  return tonumber(entry[2]), hits_of(entry[1]), entry[1]
end

-- The hits of the entries at or before `until_`, which have left the window.
local function hits_until(call, log, until_)
  local hits = 0
  for _, member in ipairs(call('ZRANGEBYSCORE', log, '-inf', until_)) do
    hits = hits + hits_of(member)
  end
  return hits
end

-- Logs `hits` at now, or into the newest entry if it is as new (the clock stepped back, or
-- another hit of this instant), so the log stays ordered and timestamps stay distinct.
-- Answers the timestamp it logged at: the newest.
local function append(call, log, hits)
  local at, held, member = newest_entry(call, log)
  if at ~= nil and at >= now then
    call('ZREM', log, member)
    call('ZADD', log, at, log_member(at, held + hits))
    return at
  end
  call('ZADD', log, now, log_member(now, hits))
  return now
end

-- Removes up to `amount` hits, newest first; how many it removed.
local function give_back(call, log, amount)
  local given = 0
  while given < amount do
    local at, held, member = newest_entry(call, log)
    if at == nil then
      break
    end
    local taken = math.min(amount - given, held)
    call('ZREM', log, member)
    if held > taken then
      call('ZADD', log, at, log_member(at, held - taken))
    end
    given = given + taken
  end
  return given
end

-- Writes the total and sets both keys to expire one window after the newest hit (rounded up
-- to the millisecond), or deletes both once the log is empty. `newest` is the newest
-- timestamp when the caller knows it. PEXPIRE with the time left equals PEXPIREAT on Redis'
-- clock, and Redis propagates it to replicas as PEXPIREAT.
local function store_log(call, log, count_key, total, window, newest)
  newest = newest or newest_entry(call, log)
  if total == 0 or newest == nil or newest + window <= now then
    call('DEL', log, count_key)
    known[count_key] = false
    return
  end
  local ttl = ttl_millis(newest + window)
  call('SET', count_key, total, 'PX', ttl)
  known[count_key] = total
  call('PEXPIRE', log, ttl)
end

-- The time until the next unit of quota comes back: until the oldest live entries holding
-- total - limit + 1 hits (at least one) have left the window; 0 for an empty log. `live` is
-- the lowest score still in the window.
local function log_reset(call, log, live, total, limit)
  local leaving = math.max(0, total - limit.quota) + 1
  local held, offset, batch = 0, 0, 1
  while held < total do
    local entries = call('ZRANGEBYSCORE', log, live, '+inf', 'WITHSCORES', 'LIMIT', offset, batch)
    if #entries == 0 then
      break
    end
    for i = 1, #entries, 2 do
      held = held + hits_of(entries[i])
      if held >= leaving then
        return math.max(0, tonumber(entries[i + 1]) + limit.window - now)
      end
    end
    offset = offset + batch
    batch = math.min(2 * batch, LOG_BATCH)
  end
  return 0
end

-- Hits at or before now - W are evicted; allowed iff total + cost <= limit, then the cost is
-- logged at now. A give-back removes the newest hits first. A check (cost 0) reads without
-- evicting. With overshoot the cost is logged whatever the answer, and a hit (a check too) is
-- allowed iff total <= limit after it.
algorithms.sliding_log = function(call, key, limit, amount, negative)
  if limit.quota == 0 then
    return admits_nothing(limit, amount, negative)
  end
  local log, count_key = log_keys(key)
  local evicted_until = int(now - limit.window)
  local live = '(' .. evicted_until
  -- No total: an empty log, or one whose total Redis evicted alone under memory pressure.
  local total = tonumber(read(call, count_key)) or hits_until(call, log, '+inf')
  if amount == 0 then
    total = total - hits_until(call, log, evicted_until)
    local allowed = not limit.overshoot or total <= limit.quota
    return allowed, math.max(0, limit.quota - total), log_reset(call, log, live, total, limit)
  end
  local before = total
  local changed = false
  local evicted = hits_until(call, log, evicted_until)
  if evicted > 0 then
    call('ZREMRANGEBYSCORE', log, '-inf', evicted_until)
    total = total - evicted
    changed = true
  end
  local allowed, newest = true, nil
  if negative then
    total = total - give_back(call, log, amount)
  elseif limit.overshoot then
    local counted = math.min(amount, LOG_MAX_TOTAL - total)
    if counted > 0 then
      newest = append(call, log, counted)
      total = total + counted
    end
    allowed = total <= limit.quota
  elseif total + amount <= limit.quota then
    newest = append(call, log, amount)
    total = total + amount
  else
    allowed = false
  end
  if changed or total ~= before then
    store_log(call, log, count_key, total, limit.window, newest)
  end
  return allowed, math.max(0, limit.quota - total), log_reset(call, log, live, total, limit)
end
