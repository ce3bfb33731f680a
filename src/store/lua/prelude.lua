-- Every counter of one or several requests, atomically: the Redis mirror of
-- src/store/algorithm (same arithmetic, same integers; a property test runs
-- random sequences through both and compares the answers). The script is
-- this prelude (arguments, helpers, the keys' values), one file per
-- algorithm, lone.lua (the lean path) and driver.lua (the general one),
-- joined by src/store/algorithm/mod.rs.
--
-- KEYS: the counters, in op order.
-- ARGV[1]: the time in ms since the epoch, or -1 to read Redis TIME (so
-- replicas with skewed clocks agree). ARGV[2]: P, the number of limit
-- shapes. ARGV[3]: hints about the whole call (0 is always correct, only
-- slower): 1 every op is a lone counter charged or checked on its own (no
-- flag 1, 16, 32 or 64, no all-or-nothing request of more than one
-- counter); 2 no key appears twice in the call.
-- Then 4 values per shape: algorithm (0 divvy window, 1 fixed, 2 sliding,
-- 3 token bucket; + 4: its ops fill, see lone.lua's `filled`; + 8: they
-- overdraw, see lone.lua's `overdrawn`), limit, window in ms, burst;
-- then the keys' shapes, flags and costs in runs, in key order: 2 values per
-- run of keys that share them: (how many keys - 1) * 2^32 + shape * 128 +
-- flags (shapes count from 1), and the cost (each argument costs Redis a
-- few Lua operations to take in: one rule's pipelined requests are 2).
-- Flags:
--   1 the op belongs to the group of the op before it (one rule's limits);
--   2 the op's group does not decide (a canary);
--   4 a request starts at this op; with 4: 8 the request is all-or-nothing,
--   16 the request is already denied (charge nothing, only answer);
--   32 give `cost` credits back instead of taking them (a refund, even of 0);
--   64 (with 32) the refund undoes a charge this store just made, which
--      another Cluster slot's denial voided (see window.lua).
-- Returns, as one MessagePack array: 2 values per key, the credits left r
-- (never negative) if allowed, else -1 - r, and the ms to reset; then 2
-- per op charged past what was left (an overdraft): its index in KEYS and
-- those credits.
local floor, min, max = math.floor, math.min, math.max
local rcall, rpcall = redis.call, redis.pcall
local now = tonumber(ARGV[1])
if now < 0 then
  local t = rcall('TIME')
  now = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
end
local format, match = string.format, string.match
-- Integers only; '%d' is far cheaper than '%.0f' where it is exact (below
-- 2^53, and only where Lua's '%d' is 64-bit: not on a 32-bit Redis build).
local wide_d = format('%d', 2^40) == '1099511627776'
local function fmt(x)
  if wide_d and x < 9e15 and x > -9e15 then return format('%d', x) end
  return format('%.0f', x)
end
-- For whole numbers below 2^53, (x - x % b) / b is floor(x / b) exactly,
-- without a math.* call (each cost a counter a few hundred instructions).
local function ceil_div(a, b)
  local x = a + b - 1
  return (x - x % b) / b
end
-- Numbers as text, each written once a call: most keys of a call share
-- their TTL, window start or cost, and a `format` costs far more than a
-- table lookup.
local texts = setmetatable({}, {__index = function(t, x)
  local v = fmt(x)
  t[x] = v
  return v
end})
-- Each algorithm file's builder, by the algorithm's number (lone.lua).
local build = {}
-- A counter's value `v` written with `ttl` ms to live (none left: deleted).
local function put(k, v, ttl)
  if ttl <= 0 then rcall('DEL', k) else rcall('SET', k, v, 'PX', texts[ttl]) end
end

-- Writes `head .. d` (the value `save` would write, to live `ttl` ms > 0)
-- over key k's value v (as read), which starts with `head`, where d is a
-- count that only grew: SETRANGE of the count where the key's expiry is
-- already that (PTTL not earlier, at most 20 ms later: Redis's clock moves
-- on during a call, `now` does not) and the new digits cover the old (not
-- so after leading zeros); else SET ... PX, as `save`.
local function rewrite(k, v, head, d, ttl)
  local p = rcall('PTTL', k)
  if p >= ttl and p <= ttl + 20 and #head + #d >= #v then
    rcall('SETRANGE', k, texts[#head], d)
  else
    rcall('SET', k, head .. d, 'PX', texts[ttl])
  end
end

local n = #KEYS
local shapes = tonumber(ARGV[2])
local hints = tonumber(ARGV[3])
local lone = hints % 2 == 1
local distinct = hints % 4 >= 2
local salg, slim, swin, sbur, sfill, sover = {}, {}, {}, {}, {}, {}
for p = 1, shapes do
  local b = 4 * p - 1
  local a = tonumber(ARGV[b + 1])
  sover[p] = a >= 8
  sfill[p] = a % 8 >= 4
  salg[p] = a % 4
  slim[p] = tonumber(ARGV[b + 2])
  swin[p] = tonumber(ARGV[b + 3])
  sbur[p] = tonumber(ARGV[b + 4])
end
local base = 3 + 4 * shapes
-- The runs' numbers and the costs are mostly the same few texts ("132",
-- "1"): each text is read once.
local number = setmetatable({}, {__index = function(t, text)
  local v = tonumber(text)
  t[text] = v
  return v
end})
-- The runs must cover the keys exactly, each with a shape of the call and
-- a whole, finite cost; a call that does not is refused whole, before
-- anything is read or written. `head(b)` reads the run whose head is
-- ARGV[b + 1]: its length, shape and flags, and cost as text; nothing for a
-- malformed one (`% 1` is not 0 for a fraction, inf or nan). Each head and
-- cost text is checked once a call.
local RUN = 4294967296 -- 2^32: a run's length - 1 is counted in these
local hlen, hx, costok = {}, {}, {}
local function head(b)
  local th, tt = ARGV[b + 1], ARGV[b + 2]
  if not tt then return end
  local c = hlen[th]
  if not c then
    local h = number[th]
    if not (h and h >= 0 and h < 2^53 and h % 1 == 0) then return end
    local x = h % RUN
    local p = (x - x % 128) / 128
    if p < 1 or p > shapes then return end
    c = (h - x) / RUN + 1
    hlen[th], hx[th] = c, x
  end
  if not costok[tt] then
    local cost = number[tt]
    if not (cost and cost >= 0 and cost % 1 == 0) then return end
    costok[tt] = true
  end
  return c, hx[th], tt
end
local function malformed() error('divvy: malformed runs of keys') end
-- A lone call's runs are checked here, as its path writes as it goes; the
-- others' as they are read into `xs` (each key's shape and flags) and `cts`
-- (its cost as text), before anything is read.
local xs, cts = {}, {}
if lone then
  local covered, b = 0, base
  while covered < n do
    local c = head(b)
    if not c then break end
    covered, b = covered + c, b + 2
  end
  if covered ~= n or ARGV[b + 1] ~= nil then malformed() end
else
  local left, x, ct = 0, 0, nil -- the run under way: keys left, its numbers
  local xb = base -- where the next run's head is
  -- Whether every op is a lone counter after all (the hint's condition).
  local whole = false -- the request under way is all-or-nothing
  local alone = true
  for i = 1, n do
    if left == 0 then
      local th, tt = ARGV[xb + 1], ARGV[xb + 2]
      left, x = hlen[th], hx[th]
      if not (left and costok[tt]) then left, x = head(xb) end
      if not left or left > n - i + 1 then malformed() end
      ct = tt
      xb = xb + 2
    end
    left = left - 1
    xs[i], cts[i] = x, ct
    local f = x % 128
    local starts = f % 8 >= 4
    if f >= 16 or (f >= 8 and not starts) then
      alone = false
    elseif starts then
      whole = f >= 8
    elseif whole or f % 2 == 1 then
      alone = false
    end
  end
  if ARGV[xb + 1] ~= nil then malformed() end
  lone = alone
end

-- Every value in one call (a few for very large calls: Lua unpacks at most
-- about 8,000 values at once). A string, or false: no key, or a key of
-- another type, which reads as no counter and is overwritten when charged.
-- A lone call of divvy's windows alone on distinct keys reads each key as
-- it goes (window.lua's A.run).
local raw, mget = {}, not (lone and distinct)
for p = 1, shapes do
  if salg[p] ~= 0 or sfill[p] or sover[p] then mget = true end
end
if not mget then
elseif n > 0 and n <= 4000 then
  raw = rcall('MGET', unpack(KEYS))
elseif n > 4000 then
  for from = 1, n, 4000 do
    local part = rcall('MGET', unpack(KEYS, from, min(from + 3999, n)))
    for i = 1, #part do raw[from + i - 1] = part[i] end
  end
end
