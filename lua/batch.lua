-- batch: the driver of every call. One call carries the counter hits of many requests (all
-- those waiting on one connection, or one cluster node, when it is sent), reads the clock
-- once, and decides each counter in order, exactly as separate calls in that order would.
--
-- Layout (all of it in ARGV; no KEYS are declared, so one call may span hash slots):
--
--   ARGV[1]          the time: '' to read Redis' TIME, else µs since the epoch (tests only)
--   ARGV[2]          '1' when every key may be read in one MGET (a standalone Redis; not a
--                    cluster node, where one command cannot span slots), else ''
--   ARGV[3]          L, the number of limits, then L × 9 entries: algorithm,
--                    requests_per_unit, window_us, capacity, token interval_us, and four
--                    calendar boundaries b0 < b1 < b2 < b3 ('' × 4 unless calendar-aligned)
--   then groups, until the end of ARGV:
--     'each', n      n counters decided one by one: key, limit index (1-based), cost
--     'all', n       one request's n counters, all or nothing (all_or_nothing.lua): key,
--                    limit index, cost, binding ('1' if its rejection rejects the request)
--
-- A cost below zero is a give-back of its absolute value. Reply: one flat array, per group
-- in order: an 'each' group's counters as allowed (1 | 0 | -1 for an error), remaining,
-- reset_us; an 'all' group's applied (1 | 0 | -1) then its counters as above; then the
-- message of every error, in order. A counter's error (a key of another type; in a cluster,
-- a key this node does not serve, before anything was written) fails that counter or that
-- 'all' group alone.

local function number(index)
  local value = tonumber(ARGV[index])
  if value == nil then
    error('ARGV[' .. index .. '] must be a number, got ' .. tostring(ARGV[index]))
  end
  return value
end

-- The instant of this call: the caller's (tests) or Redis' own, the same for every replica.
if ARGV[1] ~= '' then
  now, supplied = number(1), true
else
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
end

-- The limits, read once however many counters share them.
local limits = {}
local at = 4
for i = 1, number(3) do
  local algorithm = algorithms[ARGV[at]]
  if algorithm == nil then
    return redis.error_reply('unknown algorithm ' .. tostring(ARGV[at]))
  end
  local limit = {
    name = ARGV[at],
    algorithm = algorithm,
    quota = number(at + 1),
    window = number(at + 2),
    capacity = number(at + 3),
    interval = number(at + 4),
  }
  if ARGV[at + 5] ~= '' then
    limit.calendar = { number(at + 5), number(at + 6), number(at + 7), number(at + 8) }
  end
  limits[i] = limit
  at = at + 9
end

-- The counter whose key is ARGV[i]: its limit, and its cost as amount and direction.
local function counter(i)
  local limit = limits[number(i + 1)]
  if limit == nil then
    error('ARGV[' .. (i + 1) .. '] names no limit: ' .. tostring(ARGV[i + 1]))
  end
  local cost = number(i + 2)
  return limit, math.abs(cost), cost < 0
end

-- Reads ahead, in one MGET per thousand, the string keys the hits will read: each GET inside
-- a script costs about as much as a whole command does outside it.
local function read_ahead(from)
  local keys, at = {}, from
  while at <= #ARGV do
    local mode, n = ARGV[at], number(at + 1)
    local width = mode == 'all' and 4 or 3
    at = at + 2
    for _ = 1, n do
      local limit = limits[tonumber(ARGV[at + 1])]
      local ahead = limit and prefetch[limit.name]
      if ahead then
        local key = ahead(ARGV[at], limit)
        if key and known[key] == nil then
          known[key] = false
          keys[#keys + 1] = key
        end
      end
      at = at + width
    end
  end
  for first = 1, #keys, 1000 do
    local last = math.min(first + 999, #keys)
    local values = redis.call('MGET', unpack(keys, first, last))
    for i = first, last do
      known[keys[i]] = values[i - first + 1]
    end
  end
end

if ARGV[2] == '1' then
  read_ahead(at)
end

local reply, errors = {}, {}
local function push(value)
  reply[#reply + 1] = value
end
local function answer(allowed, remaining, reset)
  push(allowed and 1 or 0)
  push(remaining)
  push(reset)
end
local function failed(count)
  for _ = 1, count do
    push(-1)
    push(0)
    push(0)
  end
end

while at <= #ARGV do
  local mode, n = ARGV[at], number(at + 1)
  at = at + 2
  if mode == 'each' then
    for _ = 1, n do
      local key = ARGV[at]
      local limit, amount, negative = counter(at)
      local ok, allowed, remaining, reset =
        pcall(limit.algorithm, redis.call, key, limit, amount, negative)
      if ok then
        answer(allowed, remaining, reset)
      else
        failed(1)
        errors[#errors + 1] = message(allowed)
      end
      at = at + 3
    end
  elseif mode == 'all' then
    local counters = {}
    for i = 1, n do
      local limit, amount, negative = counter(at)
      counters[i] = {
        algorithm = limit.algorithm, key = ARGV[at], limit = limit, amount = amount,
        negative = negative, binding = ARGV[at + 3] == '1',
      }
      at = at + 4
    end
    local applied, decisions = all_or_nothing(counters)
    if applied == nil then
      push(-1)
      failed(n)
      errors[#errors + 1] = decisions
    else
      push(applied and 1 or 0)
      for _, d in ipairs(decisions) do
        answer(d[1], d[2], d[3])
      end
    end
  else
    return redis.error_reply('ARGV[' .. (at - 2) .. '] is no group mode: ' .. tostring(mode))
  end
end

for _, text in ipairs(errors) do
  push(text)
end
return reply
