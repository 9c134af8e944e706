-- fixed_window: one count per window. The Lua twin of src/limiter/fixed_window.rs.
--
-- Windows are aligned on the epoch (start = now - now % W) or, when the caller sends calendar
-- boundaries (a limit with a time zone), on the calendar. The count starts from zero in every
-- window, so up to twice the limit can pass around a boundary.
--
-- State: the hash key = {window_end, count}, expiring at window_end.

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

-- Allowed iff count + cost <= limit; a give-back lowers the count, never below zero. A hit
-- that changes nothing writes nothing.
algorithms.fixed_window = function(call, key, limit, amount, negative)
  local quota = limit.quota
  if quota == 0 then
    return admits_nothing(limit, amount, negative)
  end
  local state = call('HMGET', key, 'window_end', 'count')
  local ends = window_end(limit)
  local current = tonumber(state[1]) == ends
  local count = 0
  if current then
    count = tonumber(state[2]) or 0
  end
  local allowed, next
  if negative then
    allowed, next = true, math.max(0, count - amount)
  else
    next = count + amount
    if next <= quota or amount == 0 then
      allowed = true
    else
      allowed, next = false, count
    end
  end
  if next ~= count then
    if current then
      -- Same window: the key already expires at its end, so the count alone changes.
      call('HSET', key, 'count', int(next))
    else
      store(call, key, ends, 'window_end', int(ends), 'count', int(next))
    end
  end
  return allowed, math.max(0, quota - next), math.max(0, ends - now)
end
