-- gcra: the generic cell rate algorithm. One timestamp per counter, the theoretical arrival
-- time (TAT): the instant the counter would be back to a full allowance if nothing else
-- arrived. The Lua twin of src/limiter/gcra.rs.
--
-- With T the token interval and B the capacity, it admits exactly what a token bucket of B
-- tokens refilled every T admits, in one number instead of two.
--
-- State: the string key = tat, expiring at the TAT; no key is a full allowance.

-- min(B, (now + B*T - tat) / T), 0 when the TAT is more than a whole burst ahead (possible
-- after a reload lowers the burst).
local function gcra_remaining(limit, tat)
  if tat <= now then
    return limit.capacity
  end
  local burst_span = limit.capacity * limit.interval
  return math.min(limit.capacity, math.floor(math.max(0, burst_span - (tat - now)) / limit.interval))
end

-- The allowance grows from `remaining` to `remaining + 1` when the TAT is only
-- (B - remaining - 1) * T ahead of the clock; 0 when the allowance is full.
local function until_next_unit(limit, tat, remaining)
  if tat <= now then
    return 0
  end
  local ahead_then = math.max(0, limit.capacity - remaining - 1) * limit.interval
  return math.max(0, (tat - now) - ahead_then)
end

--   new_tat  = max(tat, now) + cost * T
--   allow_at = new_tat - B * T        allowed iff allow_at <= now, then tat = new_tat
--
-- A give-back moves the TAT back by cost * T, never before now, and leaves a full allowance
-- as it is. With overshoot the TAT always moves on by the cost, and a hit (a check too) is
-- allowed iff tat - B * T <= now after it.
algorithms.gcra = function(call, key, limit, amount, negative)
  if limit.quota == 0 or limit.capacity == 0 then
    return admits_nothing(limit, amount, negative)
  end
  local burst_span = limit.capacity * limit.interval
  local cost_span = amount * limit.interval
  local tat = tonumber(read(call, key)) or 0
  local allowed, next = true, tat
  if amount == 0 and not limit.overshoot then
    allowed = true
  elseif negative then
    -- A full allowance stays as it was: raising an old TAT to now would take quota back from
    -- the hits of a clock that then steps back.
    if tat > now then
      next = math.max(tat - cost_span, now)
    end
  elseif limit.overshoot then
    -- Charged whatever the answer; the answer is whether the allowance was not overdrawn.
    if amount > 0 then
      -- At most 100 years owed (MAX_OVERDRAFT), so the TAT stays exact.
      next = math.min(math.max(tat, now) + cost_span, now + MAX_OVERDRAFT)
    end
    allowed = next - burst_span <= now
  else
    local new_tat = math.max(tat, now) + cost_span
    allowed = new_tat - burst_span <= now
    if allowed then
      next = new_tat
    end
  end
  if next ~= tat then
    -- SET … PX with the time left equals PEXPIREAT tat on Redis' clock. A TAT at or before
    -- now is the same as none.
    if next <= now then
      call('DEL', key)
      known[key] = false
    else
      call('SET', key, next, 'PX', ttl_millis(next))
      known[key] = next
    end
  end
  local left = gcra_remaining(limit, next)
  return allowed, left, until_next_unit(limit, next, left)
end
