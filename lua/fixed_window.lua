-- fixed_window: one count per window. The Lua twin of src/limiter/fixed_window.rs.
--
-- Windows are aligned on the epoch (start = now - now % W) or, when the caller sends calendar
-- boundaries (a limit with a time zone), on the calendar. The count starts from zero in every
-- window, so up to twice the limit can pass around a boundary.
--
-- State: the count of the window ending at window_end, an integer in the string key
-- key .. ':' .. window_end (in seconds), expiring at window_end. A key per window: a window's
-- count is read, incremented and created in one command each, and a key that outlives its
-- window by the TTL's rounding is never read as another window's.

-- The end of the window containing now: epoch-aligned multiples of the window length, or the
-- calendar window among [b0, b1), [b1, b2), [b2, b3) that contains now (the nearest one if
-- none does: the caller's clock and Redis' disagree by more than a window).
local function window_end(limit)
  local b = limit.calendar
  if b == nil then
    return now - now % limit.window + limit.window
  end
  if now < b[2] then
    return b[2]
  elseif now < b[3] then
    return b[3]
  end
  return b[4]
end

-- The key holding the count of the window ending at `ends`; script.rs `state_keys` names it
-- the same way. Windows end on whole seconds; the seconds are below 10^14, which `..` prints
-- exactly. The suffix is made once per limit and call: every hit of a call shares `now`.
local function window_key(key, limit, ends)
  if limit.ends ~= ends then
    local seconds = ends / 1000000
    if seconds ~= math.floor(seconds) then
      limit.suffix = ':' .. int(ends) .. 'us'
    else
      limit.suffix = ':' .. seconds
    end
    limit.ends = ends
  end
  return key .. limit.suffix
end

-- A hit that takes quota from a count not read yet in this call: INCRBY first, which
-- creates a window's key with its first hit, and then its expiry; over the limit, the count
-- is put back as it was (a key the hit created is deleted). One command for most hits, where
-- reading first costs two; a rejection writes and undoes, and leaves the key as it found it.
local function take(call, counter, limit, ends, amount)
  local quota = limit.quota
  local after = call('INCRBY', counter, amount)
  local before = after - amount
  local reset = math.max(0, ends - now)
  -- An overshoot charge stays counted past the limit.
  if after <= quota or limit.overshoot then
    -- A count of 0 is never kept (a give-back to 0 deletes the key), so `before == 0` means
    -- the hit created the key.
    if before == 0 then
      call('PEXPIRE', counter, ttl_millis(ends))
    end
    known[counter] = after
    return after <= quota, math.max(0, quota - after), reset
  end
  if before == 0 then
    call('DEL', counter)
    known[counter] = false
  else
    call('DECRBY', counter, amount)
    known[counter] = before
  end
  return false, math.max(0, quota - before), reset
end

-- Allowed iff count + cost <= limit; a give-back lowers the count, never below zero. A check
-- or a give-back that changes nothing writes nothing. With overshoot the cost is counted
-- whatever the answer (a check is refused once the count is past the limit).
algorithms.fixed_window = function(call, key, limit, amount, negative)
  local quota = limit.quota
  if quota == 0 then
    return admits_nothing(limit, amount, negative)
  end
  local ends = window_end(limit)
  local counter = window_key(key, limit, ends)
  if not negative and amount > 0 and known[counter] == nil then
    return take(call, counter, limit, ends, amount)
  end
  local count = tonumber(read(call, counter)) or 0
  local allowed, next
  if negative then
    allowed, next = true, math.max(0, count - amount)
  else
    next = count + amount
    if limit.overshoot then
      allowed = next <= quota
    elseif next <= quota or amount == 0 then
      allowed = true
    else
      allowed, next = false, count
    end
  end
  if next ~= count then
    if next == 0 then
      call('DEL', counter)
      known[counter] = false
    elseif count == 0 then
      call('SET', counter, next, 'PX', ttl_millis(ends))
      known[counter] = next
    else
      -- The key already expires at the window's end: the count alone changes.
      known[counter] = call('INCRBY', counter, next - count)
    end
  end
  return allowed, math.max(0, quota - next), math.max(0, ends - now)
end
