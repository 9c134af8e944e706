#!lua flags=allow-cross-slot-keys
-- The prelude of floodgate's one script: src/backend/redis/script.rs joins it, the five
-- algorithms, all_or_nothing.lua and batch.lua into a single text, loaded once and called by
-- EVALSHA. The flag lets one call touch counters of several hash slots owned by the node it
-- runs on (a cluster batch); on a standalone Redis it changes nothing.
--
-- Each algorithm registers `algorithms.<name> = function(call, key, limit, amount, negative)`
-- that decides one hit and answers `allowed, remaining, reset_us`. `call` is redis.call, or
-- all_or_nothing.lua's recording stand-in. `limit` is a table read once per call of the
-- script (batch.lua). Layout and reply: lua/README.md. All numbers are integer microseconds
-- held in doubles, exact below 2^53.

local algorithms = {}

-- The most an overshooting charge may owe, in µs of refill: 100 years (the Rust twins'
-- MAX_SPAN_MICROS), so every instant stays exact in doubles.
local MAX_OVERDRAFT = 3153600000000000

-- The instant every counter of this call is decided at: Redis' own TIME, read once by
-- batch.lua, or the caller's instant in tests (`supplied`).
local now
local supplied = false

-- The values of string keys as this call last read or wrote them: `false` for no key, nil
-- for not known. The algorithms keep it up to date as they write, and all_or_nothing.lua
-- forgets what it puts back: a counter hit again in the same call (a hot key) costs no
-- second GET, which inside a script costs about what a whole command does.
local known = {}

-- The value of the string key `key` (false when there is none).
local function read(call, key)
  local value = known[key]
  if value == nil then
    value = call('GET', key)
    known[key] = value
  end
  return value
end

-- Integers as decimal digits, for text such as a key name: tostring() would keep only 14
-- significant digits. A number given to redis.call needs no such care: Redis writes it with
-- 17 significant digits, exact for every integer below 2^53, and without string.format's
-- cost, which is that of a whole command.
local function int(value)
  return string.format('%.0f', value)
end

-- Milliseconds from now until expires_at, rounded up: the TTL that ends a key just after its
-- state stops mattering. When the caller supplies the time (tests), Redis still expires keys
-- on its own clock, which runs on between calls that are microseconds apart in the supplied
-- time: a minute of slack keeps such a key until the next call has read it. A state that
-- outlives its useful life reads as a fresh counter, so the slack changes no decision.
local function ttl_millis(expires_at)
  local millis = math.ceil((expires_at - now) / 1000)
  if supplied then
    millis = millis + 60000
  end
  return millis
end

-- Writes a hash state with a TTL ending at expires_at (rounded up to the millisecond).
-- PEXPIRE with the time left equals PEXPIREAT expires_at on Redis' clock, and Redis
-- propagates it to replicas as PEXPIREAT. A state that has expired already is the same as
-- none.
local function store(call, key, expires_at, ...)
  if expires_at <= now then
    call('DEL', key)
    return
  end
  call('HSET', key, ...)
  call('PEXPIRE', key, ttl_millis(expires_at))
end

-- counter.rs: a limit that admits nothing (requests_per_unit 0, or a bucket of capacity 0)
-- answers without touching the state.
local function admits_nothing(limit, amount, negative)
  return (amount == 0 or negative), 0, limit.window
end
