-- gcra: the generic cell rate algorithm. One timestamp per counter, the theoretical arrival
-- time (TAT): the instant the counter would be back to a full allowance if nothing else
-- arrived. The Lua twin of src/limiter/gcra.rs.
--
-- With T the token interval and B the capacity, it admits exactly what a token bucket of B
-- tokens refilled every T admits, in one number instead of two.
--
-- State: the string KEYS[1] = tat, expiring at the TAT; no key is a full allowance.
-- Runs after lua/prelude.lua (key, quota, window_micros, amount, negative, now, number,
-- int). Arguments and reply: lua/README.md.

local capacity = number(5)
local interval = number(6)

-- Writes the TAT with a TTL ending at it (rounded up to the millisecond): SET … PX with the
-- time left equals PEXPIREAT tat on Redis' clock. A TAT at or before now is the same as none.
local function store(tat)
  if tat <= now then
    redis.call('DEL', key)
    return
  end
  redis.call('SET', key, int(tat), 'PX', ttl_millis(tat))
end

-- min(B, (now + B*T - tat) / T), 0 when the TAT is more than a whole burst ahead (possible
-- after a reload lowers the burst).
local function remaining(tat, burst_span)
  if tat <= now then
    return capacity
  end
  return math.min(capacity, math.floor(math.max(0, burst_span - (tat - now)) / interval))
end

-- The allowance grows from `remaining` to `remaining + 1` when the TAT is only
-- (B - remaining - 1) * T ahead of the clock; 0 when the allowance is full.
local function until_next_unit(tat, remaining)
  if tat <= now then
    return 0
  end
  local ahead_then = math.max(0, capacity - remaining - 1) * interval
  return math.max(0, (tat - now) - ahead_then)
end

-- counter.rs: a limit that admits nothing answers without touching the state.
if quota == 0 or capacity == 0 then
  return { (amount == 0 or negative) and 1 or 0, 0, window_micros }
end

--   new_tat  = max(tat, now) + cost * T
--   allow_at = new_tat - B * T        allowed iff allow_at <= now, then tat = new_tat
--
-- A give-back moves the TAT back by cost * T, never before now, and leaves a full allowance
-- as it is.
local function hit()
  local burst_span = capacity * interval
  local cost_span = amount * interval
  local tat = tonumber(redis.call('GET', key)) or 0
  local allowed, next = true, tat
  if amount == 0 then
    allowed = true
  elseif negative then
    -- A full allowance stays as it was: raising an old TAT to now would take quota back from
    -- the hits of a clock that then steps back.
    if tat > now then
      next = math.max(tat - cost_span, now)
    end
  else
    local new_tat = math.max(tat, now) + cost_span
    allowed = new_tat - burst_span <= now
    if allowed then
      next = new_tat
    end
  end
  if next ~= tat then
    store(next)
  end
  local left = remaining(next, burst_span)
  return { allowed and 1 or 0, left, until_next_unit(next, left) }
end

return hit()
