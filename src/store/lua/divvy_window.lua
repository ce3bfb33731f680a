-- divvy's window, atomically, for every counter of one request (or of a
-- batch of requests, each one's counters contiguous and in order).
-- KEYS[i]: a counter (divvy's key shape). ARGV[3i-2]: credit limit,
-- ARGV[3i-1]: window in seconds, ARGV[3i]: credits to take (0 = check only;
-- negative = give that many back to an open window, never above the limit).
-- Stored value: the credits left; the key's TTL is the window. This is the
-- original divvy server's layout, so both can share one Redis.
-- Returns, per key: allowed (1/0), credits left, milliseconds to reset.
-- The common path (an open window with credit left) costs two calls.
local out = {}
for i = 1, #KEYS do
  local key = KEYS[i]
  local limit = tonumber(ARGV[3 * i - 2])
  local window = tonumber(ARGV[3 * i - 1])
  local cost = tonumber(ARGV[3 * i])
  local ttl = redis.call('PTTL', key)
  local allowed = 0
  local left
  if cost < 0 then
    -- A refund: only an open window of ours gets credit back.
    allowed = 1
    left = limit
    local current = ttl ~= -2 and tonumber(redis.pcall('GET', key)) or nil
    if current == nil then
      ttl = window * 1000
    else
      left = math.min(limit, current - cost)
      if left ~= current then
        redis.call('SET', key, left, 'KEEPTTL')
      end
      if ttl == -1 then
        redis.call('EXPIRE', key, window)
        ttl = window * 1000
      end
    end
  elseif ttl == -2 then
    -- No open window: the first hit opens one.
    left = limit
    ttl = window * 1000
    if cost == 0 then
      if limit > 0 then allowed = 1 end
    elseif cost <= limit then
      left = limit - cost
      redis.call('SET', key, left, 'EX', window)
      allowed = 1
    end
  else
    local fresh = false
    if cost == 0 then
      left = tonumber(redis.pcall('GET', key))
      if left == nil then
        -- Not a counter we wrote: a check sees a fresh window, changes nothing.
        fresh = true
        left = limit
        if limit > 0 then allowed = 1 end
        ttl = window * 1000
      elseif left > 0 then
        allowed = 1
      end
    else
      left = redis.pcall('DECRBY', key, cost)
      if type(left) == 'table' then
        -- Not a number (not a counter we wrote): open a fresh window.
        left = limit
        if cost <= limit then
          left = limit - cost
          redis.call('SET', key, left, 'EX', window)
          allowed = 1
        end
        ttl = window * 1000
        fresh = true
      elseif left >= 0 then
        allowed = 1
      else
        -- Not enough credit: a denied hit is never charged.
        left = redis.call('INCRBY', key, cost)
      end
    end
    if ttl == -1 and not fresh then
      -- A counter without expiry would never reset: give it the window.
      redis.call('EXPIRE', key, window)
      ttl = window * 1000
    end
  end
  out[#out + 1] = allowed
  out[#out + 1] = left
  out[#out + 1] = ttl
end
return out
