-- batch: the driver of every call. One call carries the counter hits of many requests (all
-- those waiting on one connection, or one cluster node, when it is sent), reads the clock
-- once, and decides each hit in order, exactly as separate calls in that order would.
--
-- Layout (every key is in ARGV; KEYS are declared only to route a cluster call by its slot):
--
--   ARGV[1]          the time: '' to read Redis' TIME, else µs since the epoch (tests only)
--   ARGV[2]          the deadline on that clock, µs: a call that runs later decides nothing
--                    ('' for none)
--   ARGV[3]          L, the number of limits, then L × 10 entries: algorithm,
--                    requests_per_unit, window_us, capacity, token interval_us, four
--                    calendar boundaries b0 < b1 < b2 < b3 ('' × 4 unless calendar-aligned),
--                    and overshoot ('1': every charge counts in full, '0')
--   then groups, until the end of ARGV:
--     'each', n, limit index (1-based), cost, then n keys
--                    n hits of one limit and one cost, decided one by one
--     'costs', n, limit index, then n × (cost, key)
--                    n hits of one limit, each at its own cost, decided one by one
--     'all', n, then n × (key, limit index, cost, binding '1' | '0')
--                    one request's hits, all or nothing (all_or_nothing.lua)
--
-- A cost below zero is a give-back of its absolute value. Reply: one flat array, the call's
-- instant first and the instant it finished second (Redis' TIME again; the supplied time in
-- tests), then per group in order: an 'each' or 'costs' group's hits, two integers each; an
-- 'all' group's `applied` (1 | 0 | -1) and then its hits; then the message of every error, in
-- order. A call past its deadline answers `{instant, 'late'}` and touches no key. A hit's integers are
-- `code`, remaining + 1 if allowed, -(remaining + 1) if rejected, 0 if it failed; and
-- reset_us. A hit's error (a key of another type; in a cluster, a key this node does not
-- serve, refused before anything was written) fails that hit or that 'all' group alone.
--
-- What a call costs inside Redis is mostly per argument, per reply integer and per command
-- (each about as much as a command from a client): hence runs of hits that share their limit
-- and cost (or their limit alone, each hit with its cost, where runs of one cost would be
-- short), two integers per hit, one protected call per run rather than per hit.

local call = redis.call

-- ARGV[index] as a number. The same few texts recur in every call (limit indices, costs),
-- and a table lookup is much cheaper than parsing them again.
local parsed = {}
local function number(index)
  local text = ARGV[index]
  local value = parsed[text]
  if value == nil then
    value = tonumber(text)
    if value == nil then
      error('ARGV[' .. index .. '] must be a number, got ' .. tostring(text))
    end
    parsed[text] = value
  end
  return value
end

-- The instant of this call: the caller's (tests) or Redis' own, the same for every replica.
if ARGV[1] ~= '' then
  now, supplied = number(1), true
else
  local time = call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
end

-- The caller answered this call's requests another way once their deadline passed (a
-- timeout, the rule's failure policy): a call that reaches Redis later must count nothing.
-- The caller puts the deadline on Redis' clock (src/backend/redis/deadline.rs) and sends the
-- requests that still have time again.
if ARGV[2] ~= '' and now > number(2) then
  return { now, 'late' }
end

-- The limits, read once however many hits share them.
local limits = {}
local at = 4
for i = 1, number(3) do
  local algorithm = algorithms[ARGV[at]]
  if algorithm == nil then
    return redis.error_reply('unknown algorithm ' .. tostring(ARGV[at]))
  end
  local limit = {
    algorithm = algorithm,
    quota = number(at + 1),
    window = number(at + 2),
    capacity = number(at + 3),
    interval = number(at + 4),
  }
  if ARGV[at + 5] ~= '' then
    limit.calendar = { number(at + 5), number(at + 6), number(at + 7), number(at + 8) }
  end
  limit.overshoot = ARGV[at + 9] == '1'
  limits[i] = limit
  at = at + 10
end

-- The limit that ARGV[index] names.
local function limit_at(index)
  local limit = limits[number(index)]
  if limit == nil then
    error('ARGV[' .. index .. '] names no limit: ' .. tostring(ARGV[index]))
  end
  return limit
end

-- The second slot is the instant the call finished, filled in at the end: with the first,
-- it tells the caller how long Redis took to get to this call and run it, whatever the
-- caller's own delays (src/backend/capacity.rs).
local reply, errors, size = { now, now }, {}, 2
local function push(code, reset)
  reply[size + 1] = code
  reply[size + 2] = reset
  size = size + 2
end
local function answer(allowed, remaining, reset)
  if allowed then
    push(remaining + 1, reset)
  else
    push(-remaining - 1, reset)
  end
end
local function failed(text)
  push(0, 0)
  errors[#errors + 1] = text
end

-- The hit decided last: when a run stops on an error, this is the hit that failed.
local current
-- Decides the hits of `limit` in ARGV[from..to]: keys at one `cost`, or, without one,
-- (cost, key) pairs.
local function run(from, to, limit, cost)
  local algorithm = limit.algorithm
  if cost ~= nil then
    local amount, negative = math.abs(cost), cost < 0
    for i = from, to do
      current = i
      answer(algorithm(call, ARGV[i], limit, amount, negative))
    end
  else
    for i = from, to, 2 do
      current = i
      local own = number(i)
      answer(algorithm(call, ARGV[i + 1], limit, math.abs(own), own < 0))
    end
  end
end

-- `run` in one protected call for the whole run; a hit that fails (it answered nothing)
-- gets its error and the run goes on after it, `step` arguments on.
local function protected(from, to, limit, cost, step)
  while from <= to do
    local ok, caught = pcall(run, from, to, limit, cost)
    if ok then
      return
    end
    failed(message(caught))
    from = current + step
  end
end

while at <= #ARGV do
  local mode, n = ARGV[at], number(at + 1)
  if mode == 'each' then
    local last = at + 3 + n
    protected(at + 4, last, limit_at(at + 2), number(at + 3), 1)
    at = last + 1
  elseif mode == 'costs' then
    local last = at + 2 + 2 * n
    protected(at + 3, last, limit_at(at + 2), nil, 2)
    at = last + 1
  elseif mode == 'all' then
    local counters = {}
    at = at + 2
    for i = 1, n do
      local cost = number(at + 2)
      local limit = limit_at(at + 1)
      counters[i] = {
        algorithm = limit.algorithm, key = ARGV[at], limit = limit, amount = math.abs(cost),
        negative = cost < 0, binding = ARGV[at + 3] == '1',
      }
      at = at + 4
    end
    local applied, decisions = all_or_nothing(counters)
    if applied == nil then
      reply[size + 1] = -1
      size = size + 1
      for _ = 1, n do
        push(0, 0)
      end
      errors[#errors + 1] = decisions
    else
      reply[size + 1] = applied and 1 or 0
      size = size + 1
      for _, d in ipairs(decisions) do
        answer(d[1], d[2], d[3])
      end
    end
  else
    return redis.error_reply('ARGV[' .. at .. '] is no group mode: ' .. tostring(mode))
  end
end

for _, text in ipairs(errors) do
  size = size + 1
  reply[size] = text
end
if not supplied then
  local time = call('TIME')
  reply[2] = tonumber(time[1]) * 1000000 + tonumber(time[2])
end
return reply
