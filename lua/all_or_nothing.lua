-- all_or_nothing: the hits of one request applied only if no binding hit is rejected (the
-- `consume_on_reject: false` setting on a standalone Redis). batch.lua runs such a request's
-- counters through `all_or_nothing` below, in the same call as other requests' counters.
--
-- The algorithms are not written twice: each runs unchanged, with a `call` that records the
-- state of each key before the first command that writes it, so that a rejection can put
-- them back.

-- Commands the algorithms use that never write: they need no undo record.
local READS = {
  GET = true, HMGET = true, TIME = true, ZCARD = true, ZCOUNT = true, ZRANGE = true,
  ZRANGEBYSCORE = true, PTTL = true, EXISTS = true,
}

-- The undo log: each key's state before this request first wrote it, in the order first
-- written. `dump` is nil for a key that did not exist.
local function undo_log()
  local saved, order = {}, {}
  local log = {}

  function log.save(key)
    if saved[key] then
      return
    end
    local record = { key = key, dump = redis.call('DUMP', key) }
    if record.dump then
      record.ttl = redis.call('PTTL', key)
    end
    saved[key] = true
    order[#order + 1] = record
  end

  -- Puts every saved key back as it was: the same bytes, the same expiry. Redis reads the
  -- clock once per script for expiry, so a PTTL read here and restored here is exact.
  function log.restore()
    for i = #order, 1, -1 do
      local record = order[i]
      if record.dump then
        redis.call('RESTORE', record.key, math.max(0, record.ttl), record.dump, 'REPLACE')
      else
        redis.call('DEL', record.key)
      end
      known[record.key] = nil
    end
  end

  return log
end

-- A `call` that saves a key before a command first writes it: the command's key (its first
-- argument), or every key of a DEL. Every command not known to read counts as a write, so an
-- algorithm that learns a new write command stays covered.
local function recording(log)
  return function(command, ...)
    local name = string.upper(command)
    if name == 'DEL' then
      for _, key in ipairs({ ... }) do
        log.save(key)
      end
    elseif not READS[name] then
      log.save((...))
    end
    return redis.call(command, ...)
  end
end

-- The text of an error a pcall caught: Redis raises a command's error as a table.
local function message(caught)
  if type(caught) == 'table' and caught.err then
    return caught.err
  end
  return tostring(caught)
end

-- Runs every counter in order, writes applied at once and recorded. If a binding counter is
-- rejected, every key goes back to its state before the request, and the counters run again
-- as checks (cost 0, which writes nothing) so each answer reports its counter as it stays,
-- with the attempt's `allowed`. Answers `applied, decisions` (each {allowed, remaining,
-- reset}), or nil and the message of an algorithm's error, after putting every key back.
local function all_or_nothing(counters)
  local log = undo_log()
  local call = recording(log)
  local decisions = {}
  local rejected = false
  for i, c in ipairs(counters) do
    local ok, allowed, remaining, reset =
      pcall(c.algorithm, call, c.key, c.limit, c.amount, c.negative)
    if not ok then
      log.restore()
      return nil, message(allowed)
    end
    decisions[i] = { allowed, remaining, reset }
    rejected = rejected or (c.binding and not allowed)
  end
  if not rejected then
    return true, decisions
  end
  log.restore()
  for i, c in ipairs(counters) do
    local _, remaining, reset = c.algorithm(redis.call, c.key, c.limit, 0, false)
    decisions[i][2], decisions[i][3] = remaining, reset
  end
  return false, decisions
end
