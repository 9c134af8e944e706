-- fixed_window: one count per window. The Lua twin of src/limiter/fixed_window.rs.
--
-- Windows are aligned on the epoch (start = now - now % W) or, when the caller sends calendar
-- boundaries (a limit with a time zone), on the calendar. The count starts from zero in every
-- window, so up to twice the limit can pass around a boundary.
--
-- State: the hash KEYS[1] = {window_end, count}, expiring at window_end.
-- Runs after lua/prelude.lua (key, quota, window_micros, amount, negative, now, number,
-- int). Arguments and reply: lua/README.md. All numbers are integer microseconds held in doubles,
-- exact below 2^53.

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

-- The end of the window containing now: epoch-aligned multiples of the window length, or the
-- calendar window among [b0, b1), [b1, b2), [b2, b3) that contains now (the nearest one if
-- none does: the caller's clock and Redis' disagree by more than a window).
local function window_end()
  if ARGV[8] == '' then
    return now - now % window_micros + window_micros
  end
  if now < number(9) then
    return number(9)
  elseif now < number(10) then
    return number(10)
  end
  return number(11)
end

-- counter.rs: a limit that admits nothing answers without touching the state.
if quota == 0 then
  return { (amount == 0 or negative) and 1 or 0, 0, window_micros }
end

-- Allowed iff count + cost <= limit; a give-back lowers the count, never below zero. A hit
-- that changes nothing writes nothing.
local function hit()
  local state = redis.call('HMGET', key, 'window_end', 'count')
  local window_end = window_end()
  local current = tonumber(state[1]) == window_end
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
      redis.call('HSET', key, 'count', int(next))
    else
      store(window_end, 'window_end', int(window_end), 'count', int(next))
    end
  end
  return { allowed and 1 or 0, math.max(0, quota - next), math.max(0, window_end - now) }
end

return hit()
