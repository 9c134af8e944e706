-- token_bucket: a bucket of B tokens refilled one token every T µs, in whole tokens. The Lua
-- twin of src/limiter/token_bucket.rs.
--
-- B is the limit's capacity (burst, else requests_per_unit) and T its token interval. Refill
-- only ever adds whole tokens and moves `last` by whole intervals, so the partial interval
-- already elapsed is kept, not lost to rounding.
--
-- State: the hash key = {tokens, last}, expiring when the bucket is full again; no key is a
-- full bucket. `tokens` is below zero only with overshoot.

-- The (tokens, last) after adding the whole intervals elapsed since `last`. A full bucket
-- restarts its interval at now: no token accrues while there is no room for it.
local function refill(limit, tokens, last)
  local gained = math.floor(math.max(0, now - last) / limit.interval)
  if tokens + gained >= limit.capacity then
    return limit.capacity, now
  end
  return tokens + gained, last + gained * limit.interval
end

-- Refill, then allowed iff cost <= tokens, then take. A give-back adds tokens up to the
-- capacity. With overshoot the cost is taken whatever the answer, leaving a debt (tokens
-- below zero) that refilling pays back first; a hit (a check too) is allowed iff no debt is
-- left after it.
algorithms.token_bucket = function(call, key, limit, amount, negative)
  local capacity, interval = limit.capacity, limit.interval
  if limit.quota == 0 or capacity == 0 then
    return admits_nothing(limit, amount, negative)
  end
  local state = call('HMGET', key, 'tokens', 'last')
  local stored_tokens, stored_last = tonumber(state[1]), tonumber(state[2])
  if stored_tokens == nil or stored_last == nil then
    stored_tokens, stored_last = capacity, now
  end
  local tokens, last = refill(limit, stored_tokens, stored_last)
  local allowed, next
  if negative then
    allowed, next = true, math.min(capacity, tokens + amount)
  elseif limit.overshoot then
    -- At most 100 years of refill owed (MAX_OVERDRAFT), so every instant stays exact.
    local deepest = -math.floor(MAX_OVERDRAFT / interval)
    next = math.max(tokens - amount, math.min(deepest, tokens))
    allowed = next >= 0
  elseif amount <= tokens then
    allowed, next = true, tokens - amount
  else
    allowed, next = false, tokens
  end
  -- Refilling alone need not be written: refilling twice gives what refilling once does.
  if next ~= tokens then
    store(call, key, last + (capacity - next) * interval, 'tokens', next, 'last', last)
  end
  -- The next unit of quota comes with the token that makes one: in debt, after it is paid.
  local reset = 0
  if next < capacity then
    reset = math.max(0, last + math.max(1, 1 - next) * interval - now)
  end
  return allowed, math.max(0, next), reset
end
