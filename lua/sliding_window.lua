-- sliding_window: two fixed-window counts, the previous one weighted by how much of it the
-- sliding window still covers. The Lua twin of src/limiter/sliding_window.rs.
--
-- The weight is the one fraction in the algorithms. Lua 5.1 numbers are doubles, so it is
-- computed exactly as the Rust twin computes it in f64, in the same order:
--
--   share    = floor(prev * ((W - elapsed) / W))
--   weighted = cur + share
--
-- State: the hash key = {window_start, prev, cur}, expiring two windows after window_start.

-- The part of a window count of `count` that still weighs `elapsed` µs into the next window.
-- Non-increasing in `elapsed`, `count` at 0 and 0 at `w`.
local function share(count, elapsed, w)
  return math.floor(count * ((w - elapsed) / w))
end

-- The smallest x in (from, w] with share(count, x) < share(count, from), for a count whose
-- share at `from` is positive. The real-number solution is only a first guess, corrected by
-- stepping until it matches the rounded share exactly, so both twins find the same instant.
local function first_drop(count, from, w)
  local target = share(count, from, w)
  local guess = w - target * w / count
  local x = math.max(from + 1, math.min(w, math.floor(guess) + 1))
  while x > from + 1 and share(count, x - 1, w) < target do
    x = x - 1
  end
  while x < w and share(count, x, w) >= target do
    x = x + 1
  end
  return x
end

-- Microseconds until the weighted count drops by at least one, 0 if it never will. Within
-- this window only the previous window's share shrinks; once it is 0, the next drop is the
-- current count starting to shrink in the next window.
local function until_next_drop(prev, cur, elapsed, w)
  if share(prev, elapsed, w) > 0 then
    return first_drop(prev, elapsed, w) - elapsed
  elseif cur > 0 then
    return (w - elapsed) + first_drop(cur, 0, w)
  end
  return 0
end

-- The most a window's count holds (u32::MAX in the Rust twin).
local MAX_COUNT = 4294967295

-- Allowed iff weighted + cost <= limit, then the cost is added to the current window. A
-- give-back takes from the current window first, then the previous. With overshoot the cost
-- is added whatever the answer (a check is refused once the weighted count is past the
-- limit).
algorithms.sliding_window = function(call, key, limit, amount, negative)
  local quota = limit.quota
  if quota == 0 then
    return admits_nothing(limit, amount, negative)
  end
  local w = limit.window
  local window_start = now - now % w
  local elapsed = now - window_start
  local state = call('HMGET', key, 'window_start', 'prev', 'cur')
  local stored_start = tonumber(state[1])
  local prev, cur = 0, 0
  if stored_start == window_start then
    prev, cur = tonumber(state[2]) or 0, tonumber(state[3]) or 0
  elseif stored_start ~= nil and stored_start + w == window_start then
    prev, cur = tonumber(state[3]) or 0, 0
  end
  local weighted = cur + share(prev, elapsed, w)
  local allowed, next_prev, next_cur
  if negative then
    local from_cur = math.min(cur, amount)
    allowed, next_prev, next_cur = true, math.max(0, prev - (amount - from_cur)), cur - from_cur
  elseif limit.overshoot then
    allowed, next_prev, next_cur = weighted + amount <= quota, prev, cur + amount
  elseif amount == 0 or weighted + amount <= quota then
    allowed, next_prev, next_cur = true, prev, cur + amount
  else
    allowed, next_prev, next_cur = false, prev, cur
  end
  if next_prev ~= prev or next_cur ~= cur then
    -- Counts are kept within 32 bits, as the Rust twin's are (only overshoot can pass them).
    store(call, key, window_start + 2 * w, 'window_start', window_start,
      'prev', math.min(next_prev, MAX_COUNT), 'cur', math.min(next_cur, MAX_COUNT))
  end
  weighted = next_cur + share(next_prev, elapsed, w)
  return allowed, math.max(0, quota - weighted), until_next_drop(next_prev, next_cur, elapsed, w)
end
