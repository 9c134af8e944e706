-- token_bucket: a bucket of B tokens refilled one token every T µs, in whole tokens. The Lua
-- twin of src/limiter/token_bucket.rs.
--
-- B is the limit's capacity (burst, else requests_per_unit) and T its token interval. Refill
-- only ever adds whole tokens and moves `last` by whole intervals, so the partial interval
-- already elapsed is kept, not lost to rounding.
--
-- State: the hash KEYS[1] = {tokens, last}, expiring when the bucket is full again; no key is
-- a full bucket. Runs after lua/prelude.lua. Arguments and reply: lua/README.md.

local capacity = number(5)
local interval = number(6)

-- Writes the state with a TTL ending at expires_at (rounded up to the millisecond). PEXPIRE
-- with the time left equals PEXPIREAT expires_at on Redis' clock, and Redis propagates it to
-- replicas as PEXPIREAT. A state that has expired already is the same as none.
local function store(expires_at, ...)
  if expires_at <= now then
    redis.call('DEL', key)
    return
  end
  redis.call('HSET', key, ...)
  redis.call('PEXPIRE', key, ttl_millis(expires_at))
end

-- The (tokens, last) after adding the whole intervals elapsed since `last`. A full bucket
-- restarts its interval at now: no token accrues while there is no room for it.
local function refill(tokens, last)
  local gained = math.floor(math.max(0, now - last) / interval)
  if tokens + gained >= capacity then
    return capacity, now
  end
  return tokens + gained, last + gained * interval
end

-- counter.rs: a limit that admits nothing answers without touching the state.
if quota == 0 or capacity == 0 then
  return { (amount == 0 or negative) and 1 or 0, 0, window_micros }
end

-- Refill, then allowed iff cost <= tokens, then take. A give-back adds tokens up to the
-- capacity.
local function hit()
  local state = redis.call('HMGET', key, 'tokens', 'last')
  local stored_tokens, stored_last = tonumber(state[1]), tonumber(state[2])
  if stored_tokens == nil or stored_last == nil then
    stored_tokens, stored_last = capacity, now
  end
  local tokens, last = refill(stored_tokens, stored_last)
  local allowed, next
  if negative then
    allowed, next = true, math.min(capacity, tokens + amount)
  elseif amount <= tokens then
    allowed, next = true, tokens - amount
  else
    allowed, next = false, tokens
  end
  -- Refilling alone need not be written: refilling twice gives what refilling once does.
  if next ~= tokens then
    store(last + (capacity - next) * interval, 'tokens', int(next), 'last', int(last))
  end
  local reset = 0
  if next < capacity then
    reset = math.max(0, last + interval - now)
  end
  return { allowed and 1 or 0, next, reset }
end

return hit()
