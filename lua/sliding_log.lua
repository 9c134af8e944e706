-- sliding_log: every counted hit with its timestamp. Exact: at any instant, the hits of the
-- last window never exceed the limit. The Lua twin of src/limiter/sliding_log.rs.
--
-- State: the sorted set KEYS[1], one member per counted unit, scored by its timestamp, and
-- the sequence KEYS[2] that numbers the members so that no two are equal. Both expire one
-- window after the newest hit, and the sequence never before the log: a sequence that
-- started over while members remain would reuse their names and lose hits.
-- Runs after lua/prelude.lua (key, quota, window_micros, amount, negative, now, number,
-- int). Arguments and reply: lua/README.md.

local seq_key = KEYS[2]

-- Members per ZADD call, well within Lua's stack.
local BATCH = 500

-- The timestamp of the oldest (rank 0) or newest (rank -1) logged hit, nil if none.
local function timestamp(rank)
  local entry = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')
  return tonumber(entry[2])
end

-- Sets both keys to expire one window after the newest hit (rounded up to the millisecond),
-- or deletes both once the log is empty. PEXPIRE with the time left equals PEXPIREAT on
-- Redis' clock, and Redis propagates it to replicas as PEXPIREAT.
local function expire()
  local newest = timestamp(-1)
  if newest == nil or newest + window_micros <= now then
    redis.call('DEL', key, seq_key)
    return
  end
  local ttl = ttl_millis(newest + window_micros)
  redis.call('PEXPIRE', key, ttl)
  redis.call('PEXPIRE', seq_key, ttl)
end

-- Logs `count` hits at now, or at the newest timestamp if the clock stepped back, so the log
-- stays in order.
local function log(count)
  local at = int(math.max(now, timestamp(-1) or now))
  local last = redis.call('INCRBY', seq_key, int(count))
  local members = {}
  for id = last - count + 1, last do
    members[#members + 1] = at
    members[#members + 1] = int(id)
    if #members == 2 * BATCH then
      redis.call('ZADD', key, unpack(members))
      members = {}
    end
  end
  if #members > 0 then
    redis.call('ZADD', key, unpack(members))
  end
  expire()
end

-- Removes the newest `count` hits (which unit of a timestamp goes first does not matter).
local function give_back(count)
  redis.call('ZREMRANGEBYRANK', key, int(-count), -1)
  expire()
end

local function decision(allowed, total, oldest)
  local reset = 0
  if oldest ~= nil then
    reset = math.max(0, oldest + window_micros - now)
  end
  return { allowed and 1 or 0, math.max(0, quota - total), reset }
end

-- counter.rs: a limit that admits nothing answers without touching the state.
if quota == 0 then
  return { (amount == 0 or negative) and 1 or 0, 0, window_micros }
end

-- Hits at or before now - W are evicted; allowed iff total + cost <= limit, then the cost is
-- logged at now. A give-back removes the newest hits first. A check (cost 0) reads without
-- evicting.
local function hit()
  local evicted_until = int(now - window_micros)
  if amount == 0 then
    local live = '(' .. evicted_until
    local total = redis.call('ZCOUNT', key, live, '+inf')
    local oldest = redis.call('ZRANGEBYSCORE', key, live, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    return decision(true, total, tonumber(oldest[2]))
  end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', evicted_until)
  local total = redis.call('ZCARD', key)
  local allowed
  if negative then
    if total > 0 then
      give_back(amount)
    end
    allowed = true
  elseif total + amount <= quota then
    log(amount)
    allowed = true
  else
    allowed = false
  end
  return decision(allowed, redis.call('ZCARD', key), timestamp(0))
end

return hit()
