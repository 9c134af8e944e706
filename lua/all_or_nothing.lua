-- all_or_nothing: every counter hit of one request in one script, applied only if no
-- binding hit is rejected (the `consume_on_reject: false` setting on a standalone Redis).
--
-- src/backend/redis/script.rs appends `return all_or_nothing({...})` after this file, the
-- table holding each algorithm's script (lua/prelude.lua + its file) wrapped unchanged as
-- `function(KEYS, ARGV, redis) ... end`: the algorithms are not written twice, and each call
-- sees its own KEYS and ARGV exactly as when it is its own script.
--
-- Call layout and reply: lua/README.md ("One request, all or nothing").

-- Commands the algorithms use that never write: they need no undo record.
local READS = {
  GET = true, HMGET = true, TIME = true, ZCARD = true, ZCOUNT = true, ZRANGE = true,
  ZRANGEBYSCORE = true, PTTL = true, EXISTS = true,
}

-- The undo log: each key's state before this script first wrote it, in the order first
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
    end
  end

  return log
end

-- A `redis` for one call whose `call` saves the call's keys before its first write. Every
-- command not known to read counts as a write, so an algorithm that learns a new write
-- command stays covered.
local function recording(log, keys)
  local function call(command, ...)
    if not READS[string.upper(command)] then
      for _, key in ipairs(keys) do
        log.save(key)
      end
    end
    return redis.call(command, ...)
  end
  return setmetatable({ call = call }, { __index = redis })
end

-- The calls packed in KEYS and ARGV. ARGV[1] is the number of calls; each call then takes
-- ARGV entries `algorithm, binding (1|0), key count, argument count, arguments…`, and its
-- keys are the next `key count` entries of KEYS.
local function unpack_calls()
  local calls = {}
  local next_key, next_arg = 1, 2
  for _ = 1, tonumber(ARGV[1]) do
    local call = {
      algorithm = ARGV[next_arg],
      binding = ARGV[next_arg + 1] == '1',
      keys = {},
      args = {},
    }
    local key_count, arg_count = tonumber(ARGV[next_arg + 2]), tonumber(ARGV[next_arg + 3])
    for i = 1, key_count do
      call.keys[i] = KEYS[next_key + i - 1]
    end
    for i = 1, arg_count do
      call.args[i] = ARGV[next_arg + 3 + i]
    end
    next_key, next_arg = next_key + key_count, next_arg + 4 + arg_count
    calls[#calls + 1] = call
  end
  return calls
end

-- The text of an error a pcall caught: Redis raises a command's error as a table.
local function message(caught)
  if type(caught) == 'table' and caught.err then
    return caught.err
  end
  return tostring(caught)
end

-- The call's arguments with a cost of 0: a check, which writes nothing.
local function as_check(args)
  local check = {}
  for i, value in ipairs(args) do
    check[i] = value
  end
  check[3], check[4] = '0', '0'
  return check
end

-- Runs every call in order, writes applied at once and recorded. If a binding call is
-- rejected, every key goes back to its state before the script, and the calls run again as
-- checks so each answer reports its counter as it stays (with the attempt's `allowed`).
-- An algorithm's error also puts every key back before it is raised.
local function all_or_nothing(algorithms)
  local calls = unpack_calls()
  local log = undo_log()
  local replies = {}
  local rejected = false
  for i, call in ipairs(calls) do
    local algorithm = algorithms[call.algorithm]
    if algorithm == nil then
      log.restore()
      return redis.error_reply('unknown algorithm ' .. tostring(call.algorithm))
    end
    local ok, reply = pcall(algorithm, call.keys, call.args, recording(log, call.keys))
    if not ok then
      log.restore()
      return redis.error_reply(message(reply))
    end
    replies[i] = reply
    rejected = rejected or (call.binding and reply[1] == 0)
  end
  if not rejected then
    return { 1, unpack(replies) }
  end
  log.restore()
  for i, call in ipairs(calls) do
    local check = algorithms[call.algorithm](call.keys, as_check(call.args), redis)
    replies[i] = { replies[i][1], check[2], check[3] }
  end
  return { 0, unpack(replies) }
end
