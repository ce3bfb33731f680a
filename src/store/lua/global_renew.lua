-- One region's lease renewal for all its global counters, atomically, on
-- the global store: the mirror of src/quota/mod.rs.
-- KEYS[i]: a global counter's hash (field = region, value =
--   "<demand/s> <grant/s> <expires ms>").
-- ARGV[1] region, ARGV[2] lease lifetime ms, ARGV[3] floor (fraction of the
-- rate), ARGV[4] headroom (fraction of demand), ARGV[5] now ms or -1 for
-- Redis TIME; then per key: rate (credits/s), demand (credits/s).
-- Returns per key: the grant (credits/s, as text), the region's target
-- (what it would get once the others have renewed), the view
-- ("region=grant region=grant ...", every live region's grant) and "1" when
-- another region holds less than 0.9 × its own target (it waits for share
-- this region holds: renew sooner to give it back), else "0".
local region = ARGV[1]
local life = tonumber(ARGV[2])
local floor_f = tonumber(ARGV[3])
local headroom = tonumber(ARGV[4])
local now = tonumber(ARGV[5])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function targets(rate, demands)
  local n = #demands
  local out, want, active = {}, {}, {}
  for i = 1, n do
    out[i] = 0
    local d = demands[i]
    if d > 0 then
      want[i] = math.max(d * (1 + headroom), floor_f * rate)
      active[#active + 1] = i
    else
      want[i] = 0
    end
  end
  local left = rate
  while #active > 0 do
    local fair = left / #active
    local rest, small = {}, 0
    for _, i in ipairs(active) do
      if demands[i] <= fair then
        local give = math.min(want[i], fair)
        out[i] = give
        left = left - give
        small = small + 1
      else
        rest[#rest + 1] = i
      end
    end
    if small == 0 then break end
    active = rest
  end
  if #active > 0 then
    local total = 0
    for _, i in ipairs(active) do total = total + want[i] end
    for _, i in ipairs(active) do out[i] = left * want[i] / total end
  elseif left > 0 then
    local total = 0
    for i = 1, n do total = total + want[i] end
    if total > 0 then
      for i = 1, n do out[i] = out[i] + left * want[i] / total end
    end
  end
  return out
end

local out = {}
for k = 1, #KEYS do
  local key = KEYS[k]
  local rate = tonumber(ARGV[5 + 2 * k - 1])
  local demand = tonumber(ARGV[5 + 2 * k])
  local raw = redis.call('HGETALL', key)
  local names, demands, grants = {}, {}, {}
  local others = 0
  for j = 1, #raw, 2 do
    local r, v = raw[j], raw[j + 1]
    if r ~= region then
      local d, g, e = string.match(v, '^(%S+) (%S+) (%S+)$')
      d, g, e = tonumber(d), tonumber(g), tonumber(e)
      if d and g and e and e > now then
        names[#names + 1] = r
        demands[#demands + 1] = d
        grants[#grants + 1] = g
        others = others + g
      else
        redis.call('HDEL', key, r)
      end
    end
  end
  names[#names + 1] = region
  demands[#demands + 1] = demand
  local t = targets(rate, demands)
  local g = math.max(math.min(t[#t], rate - others), 0)
  local waiting = '0'
  for i = 1, #names - 1 do
    if grants[i] < 0.9 * t[i] then waiting = '1' end
  end
  redis.call('HSET', key, region, string.format('%.6f %.6f %.0f', demand, g, now + life))
  redis.call('PEXPIRE', key, life * 3)
  local view = {}
  for i = 1, #names - 1 do view[#view + 1] = names[i] .. '=' .. string.format('%.6f', grants[i]) end
  view[#view + 1] = region .. '=' .. string.format('%.6f', g)
  out[#out + 1] = string.format('%.6f', g)
  out[#out + 1] = string.format('%.6f', t[#t])
  out[#out + 1] = table.concat(view, ' ')
  out[#out + 1] = waiting
end
return out
