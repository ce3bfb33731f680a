-- One region's lease renewal for all its global counters, atomically, on
-- the global store: the mirror of src/quota/mod.rs (`renew`).
-- KEYS[i]: a global counter's hash (field = region, value =
--   "<demand/s> <grant/s> <expires ms> <reserve/s> <until ms> <weight>"; a
--   record of an older form reads as weight 0, and one of three numbers
--   "<demand/s> <grant/s> <expires ms>" as no reserve).
-- ARGV[1] region, ARGV[2] lease lifetime ms, ARGV[3] floor (fraction of the
-- rate), ARGV[4] headroom (fraction of demand), ARGV[5] now ms or -1 for
-- Redis TIME, ARGV[6] fallback share, ARGV[7] fallback ms (how long after
-- its grant lapses the region keeps deciding on that share); then per key:
-- rate (credits/s), demand (credits/s), base (the region's lease in force,
-- credits/s: what it falls back from if this answer never reaches it),
-- weight (how many claimants the region stands for: its users asking now
-- on a fairShare limit; 0: it claims as one).
-- A region's record holds back its grant (or its reserve, if larger) until
-- it expires, then its reserve (fallback share x max(grant, base)) for the
-- fallback time, then goes: a region cut off from this store decides on
-- exactly that reserve for exactly that time, so the grants of the others
-- and the reserves never sum above the rate.
-- Returns per key: the grant (credits/s, as text), the region's target
-- (what it would get once the others have renewed), the view
-- ("region=grant region=grant ...": every live region's grant, and the
-- reserve of each region whose grant lapsed) and "1" when another live
-- region holds less than 0.9 x its own target (it waits for share this
-- region holds: renew sooner to give it back), else "0".
local region = ARGV[1]
local life = tonumber(ARGV[2])
local floor_f = tonumber(ARGV[3])
local headroom = tonumber(ARGV[4])
local now = tonumber(ARGV[5])
local share = tonumber(ARGV[6])
local hold = tonumber(ARGV[7])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Weighted max-min when every region with demand has a weight (its users
-- asking now on a fairShare limit): splits and the rest go by weight.
-- Otherwise (a weight 0: claims as one) the rest goes by demand.
local function targets(rate, demands, weights)
  local n = #demands
  local out, want, active = {}, {}, {}
  local weighted = true
  for i = 1, n do
    if demands[i] > 0 and weights[i] < 1 then weighted = false end
  end
  local function weight(i)
    if weighted then return math.max(weights[i], 1) end
    return 1
  end
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
    local units = 0
    for _, i in ipairs(active) do units = units + weight(i) end
    local unit = left / units
    local rest, small = {}, 0
    for _, i in ipairs(active) do
      if demands[i] <= unit * weight(i) then
        local give = math.min(want[i], unit * weight(i))
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
    for _, i in ipairs(active) do
      if weighted then total = total + weight(i) else total = total + want[i] end
    end
    for _, i in ipairs(active) do
      local part = want[i]
      if weighted then part = weight(i) end
      out[i] = left * part / total
    end
  elseif left > 0 then
    local total = 0
    for i = 1, n do total = total + want[i] end
    if total > 0 then
      for i = 1, n do out[i] = out[i] + left * want[i] / total end
    end
  end
  return out
end

-- A record as (demand, grant, expires, reserve, until, weight), or nil.
local function parse(v)
  local d, g, e, res, u, w = string.match(v, '^(%S+) (%S+) (%S+) (%S+) (%S+) (%S+)$')
  if not d then
    d, g, e, res, u = string.match(v, '^(%S+) (%S+) (%S+) (%S+) (%S+)$')
    w = 0
  end
  if not d then
    d, g, e = string.match(v, '^(%S+) (%S+) (%S+)$')
    res, u, w = 0, e, 0
  end
  d, g, e, res, u, w = tonumber(d), tonumber(g), tonumber(e), tonumber(res), tonumber(u), tonumber(w)
  if d and g and e and res and u and w then return d, g, e, res, u, math.max(w, 0) end
  return nil
end

local out = {}
for k = 1, #KEYS do
  local key = KEYS[k]
  local rate = tonumber(ARGV[7 + 4 * k - 3])
  local demand = tonumber(ARGV[7 + 4 * k - 2])
  local base = tonumber(ARGV[7 + 4 * k - 1])
  local weight = math.max(tonumber(ARGV[7 + 4 * k]), 0)
  local raw = redis.call('HGETALL', key)
  local names, demands, grants, weights, view = {}, {}, {}, {}, {}
  local others = 0
  for j = 1, #raw, 2 do
    local r, v = raw[j], raw[j + 1]
    if r ~= region then
      local d, g, e, res, u, w = parse(v)
      if d and e > now then
        names[#names + 1] = r
        demands[#demands + 1] = d
        grants[#grants + 1] = g
        weights[#weights + 1] = w
        others = others + math.max(g, res)
        view[#view + 1] = r .. '=' .. string.format('%.6f', g)
      elseif d and u > now then
        others = others + res
        view[#view + 1] = r .. '=' .. string.format('%.6f', res)
      else
        redis.call('HDEL', key, r)
      end
    end
  end
  demands[#demands + 1] = demand
  weights[#weights + 1] = weight
  local t = targets(rate, demands, weights)
  local g = math.max(math.min(t[#t], rate - others), 0)
  local waiting = '0'
  for i = 1, #names do
    if grants[i] < 0.9 * t[i] then waiting = '1' end
  end
  local expires = now + life
  redis.call('HSET', key, region, string.format('%.6f %.6f %.0f %.6f %.0f %.6f',
    demand, g, expires, share * math.max(g, base), expires + hold, weight))
  redis.call('PEXPIRE', key, life * 3 + hold)
  view[#view + 1] = region .. '=' .. string.format('%.6f', g)
  out[#out + 1] = string.format('%.6f', g)
  out[#out + 1] = string.format('%.6f', t[#t])
  out[#out + 1] = table.concat(view, ' ')
  out[#out + 1] = waiting
end
return out
