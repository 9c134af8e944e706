-- The prelude of every floodgate script: src/backend/redis/script.rs puts it before each
-- algorithm's body, so the five scripts share one reading of the arguments and the clock.
-- Arguments and reply: lua/README.md. All numbers are integer microseconds held in doubles,
-- exact below 2^53.

local key = KEYS[1]

local function number(index)
  local value = tonumber(ARGV[index])
  if value == nil then
    error('ARGV[' .. index .. '] must be an integer, got ' .. tostring(ARGV[index]))
  end
  return value
end

-- Integers as decimal digits: tostring() would keep only 14 significant digits.
local function int(value)
  return string.format('%.0f', value)
end

-- The caller's instant (tests), or Redis' own clock, the same for every replica.
local function clock()
  if ARGV[7] ~= '' then
    return number(7)
  end
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000000 + tonumber(time[2])
end

local quota = number(1)
local window_micros = number(2)
local amount = number(3)
local negative = ARGV[4] == '1'
local now = clock()

-- Milliseconds from now until expires_at, rounded up: the TTL that ends a key just after its
-- state stops mattering. When the caller supplies the time (tests), Redis still expires keys
-- on its own clock, which runs on between calls that are microseconds apart in the supplied
-- time: a minute of slack keeps such a key until the next call has read it. A state that
-- outlives its useful life reads as a fresh counter, so the slack changes no decision.
local function ttl_millis(expires_at)
  local millis = math.ceil((expires_at - now) / 1000)
  if ARGV[7] ~= '' then
    millis = millis + 60000
  end
  return int(millis)
end
