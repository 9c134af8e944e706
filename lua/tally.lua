-- tally: a sum kept for one window from the hit that starts it, then forgotten whole. The
-- Lua twin of src/limiter/tally.rs. No rule counts with it: it holds the Rate Limit Quota
-- Service's demand of one bucket in one period (src/quota/charge.rs).
--
-- State: the sum, an integer in the string key itself, which expires one window after the
-- hit that created it. A take is one INCRBY (and the PEXPIRE of a sum it starts), a check
-- one GET: the cheapest count there is. Reset is the window, the longest the sum can take to
-- be forgotten (reading the key's expiry would cost a command).
algorithms.tally = function(call, key, limit, amount, negative)
  local quota = limit.quota
  if quota == 0 then
    return admits_nothing(limit, amount, negative)
  end
  local count
  if negative then
    local held = tonumber(read(call, key)) or 0
    count = math.max(0, held - amount)
    if count == 0 and held > 0 then
      call('DEL', key)
      known[key] = false
    elseif count ~= held then
      known[key] = call('INCRBY', key, count - held)
    end
  elseif amount > 0 then
    count = call('INCRBY', key, amount)
    if count == amount then
      call('PEXPIRE', key, ttl_millis(now + limit.window))
    end
    known[key] = count
  else
    count = tonumber(read(call, key)) or 0
  end
  return count <= quota, math.max(0, quota - count), limit.window
end
