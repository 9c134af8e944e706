-- sliding_log: every counted hit with its timestamp. Exact: at any instant, the hits of the
-- last window never exceed the limit. The Lua twin of src/limiter/sliding_log.rs.
--
-- State: the sorted set key, one member per counted unit, scored by its timestamp, and the
-- sequence key .. ':seq' that numbers the members so that no two are equal (the same hash
-- tag, so the same cluster slot). Both expire one window after the newest hit, and the
-- sequence never before the log: a sequence that started over while members remain would
-- reuse their names and lose hits.

-- Members per ZADD call, well within Lua's stack.
local LOG_BATCH = 500

-- The second key of a sliding log (script.rs: `sequence_key`).
local function sequence_of(key)
  return key .. ':seq'
end

-- The timestamp of the oldest (rank 0) or newest (rank -1) logged hit, nil if none.
local function timestamp(call, key, rank)
  local entry = call('ZRANGE', key, rank, rank, 'WITHSCORES')
  return tonumber(entry[2])
end

-- Sets both keys to expire one window after the newest hit (rounded up to the millisecond),
-- or deletes both once the log is empty. PEXPIRE with the time left equals PEXPIREAT on
-- Redis' clock, and Redis propagates it to replicas as PEXPIREAT.
local function expire_log(call, key, window)
  local newest = timestamp(call, key, -1)
  if newest == nil or newest + window <= now then
    call('DEL', key, sequence_of(key))
    return
  end
  local ttl = ttl_millis(newest + window)
  call('PEXPIRE', key, ttl)
  call('PEXPIRE', sequence_of(key), ttl)
end

-- Logs `count` hits at now, or at the newest timestamp if the clock stepped back, so the log
-- stays in order.
local function append(call, key, window, count)
  local at = math.max(now, timestamp(call, key, -1) or now)
  local last = call('INCRBY', sequence_of(key), count)
  local members = {}
  for id = last - count + 1, last do
    members[#members + 1] = at
    members[#members + 1] = id
    if #members == 2 * LOG_BATCH then
      call('ZADD', key, unpack(members))
      members = {}
    end
  end
  if #members > 0 then
    call('ZADD', key, unpack(members))
  end
  expire_log(call, key, window)
end

local function log_decision(limit, allowed, total, oldest)
  local reset = 0
  if oldest ~= nil then
    reset = math.max(0, oldest + limit.window - now)
  end
  return allowed, math.max(0, limit.quota - total), reset
end

-- Hits at or before now - W are evicted; allowed iff total + cost <= limit, then the cost is
-- logged at now. A give-back removes the newest hits first. A check (cost 0) reads without
-- evicting.
algorithms.sliding_log = function(call, key, limit, amount, negative)
  if limit.quota == 0 then
    return admits_nothing(limit, amount, negative)
  end
  local evicted_until = int(now - limit.window)
  if amount == 0 then
    local live = '(' .. evicted_until
    local total = call('ZCOUNT', key, live, '+inf')
    local oldest = call('ZRANGEBYSCORE', key, live, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    return log_decision(limit, true, total, tonumber(oldest[2]))
  end
  call('ZREMRANGEBYSCORE', key, '-inf', evicted_until)
  local total = call('ZCARD', key)
  local allowed
  if negative then
    if total > 0 then
      -- The newest `amount` hits go (which unit of a timestamp goes first does not matter).
      call('ZREMRANGEBYRANK', key, -amount, -1)
      expire_log(call, key, limit.window)
    end
    allowed = true
  elseif total + amount <= limit.quota then
    append(call, key, limit.window, amount)
    allowed = true
  else
    allowed = false
  end
  return log_decision(limit, allowed, call('ZCARD', key), timestamp(call, key, 0))
end
