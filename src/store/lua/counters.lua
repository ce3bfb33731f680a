-- Every counter of one or several requests, atomically: the Redis mirror of
-- src/store/algorithm (same arithmetic, same integers; a property test runs
-- random sequences through both and compares the answers).
--
-- ARGV[1]: the time in ms since the epoch, or -1 to read Redis TIME (so
-- replicas with skewed clocks agree). ARGV[2]: P, the number of limit
-- shapes. ARGV[3]: what the sender knows of the whole call, which spares
-- the script finding it out (0 is always correct, only slower):
--   1 every op is a lone counter charged or checked on its own: none in
--     another's group (flag 1 below), no request denied beforehand (16),
--     no refund (32, 64), no all-or-nothing request (8) of more than one
--     counter;
--   2 no key appears twice in the call.
-- Then 4 values per shape:
--   algorithm (0 divvy window, 1 fixed, 2 sliding, 3 token bucket),
--   limit, window in ms, burst;
-- then the keys' shapes, flags and costs in runs, in key order: 2 values per
-- run of keys that share them: (how many keys - 1) * 2^32 + shape * 128 +
-- flags (shapes count from 1), and the cost. Most keys of a batch share a
-- few shapes, and the pipelined requests of one rule share all three, so
-- a call of 60 such keys sends 2 numbers for them, not 120 (each argument
-- costs Redis as much as a few Lua operations to take in); a key unlike
-- its neighbours (one rule's limits alternate) costs 2, as before runs.
-- Flags:
--   1 the op belongs to the group of the op before it (one rule's limits);
--   2 the op's group does not decide (a canary);
--   4 a request starts at this op; with 4: 8 the request is all-or-nothing,
--   16 the request is already denied (charge nothing, only answer);
--   32 give `cost` credits back instead of taking them (a refund, even of 0);
--   64 (with 32) the refund undoes a charge this store just made, which
--      another Cluster slot's denial voided: a divvy window given back to
--      its full credits is removed, as the charge had opened it.
-- Stored values: divvy window: credits left (against the rule's own limit,
-- sent as the burst), TTL = the window (divvy's own layout); fixed: "start:count"; sliding: "start:prev:cur"; token bucket:
-- "used:at" (used capacity, credits x window ms; at: ms it is valid at).
-- Returns 2 values per key: the credits left r (never negative) if allowed,
-- else -1 - r; and the ms to reset. (Allowed rides on the sign: each value
-- returned costs a call about as much as one Redis command's key lookup.)
local floor, min, max = math.floor, math.min, math.max
local rcall, rpcall = redis.call, redis.pcall
local now = tonumber(ARGV[1])
if now < 0 then
  local t = rcall('TIME')
  now = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
end
local format, match, find = string.format, string.match, string.find
-- Integers only; '%d' is far cheaper than '%.0f' where it is exact (below
-- 2^53, and only where Lua's '%d' is 64-bit: not on a 32-bit Redis build).
local wide_d = format('%d', 2^40) == '1099511627776'
local function fmt(x)
  if wide_d and x < 9e15 and x > -9e15 then return format('%d', x) end
  return format('%.0f', x)
end
local function has(f, bit) return f % (bit * 2) >= bit end
-- A divvy window's stored value as credits, or false for no counter: not a
-- number, or one beyond 2^53 either way, inf or nan (a value someone else
-- wrote, which Redis would return as a wrong integer). (The lean path has
-- this inline for a lone counter.)
local function window_credits(v)
  local s = type(v) == 'string' and tonumber(v)
  if s and s == s and s < 9e15 and s > -9e15 then return s end
  return false
end

-- The algorithms, built only when a call needs them (the lean path below
-- needs none for divvy's window, nor for a lone counter of another
-- algorithm that is allowed: it has those cases inline): creating these
-- closures on every call cost a measurable share of a small call. The lean
-- path's inline copies of `decode`, `expires`, `encode` and of the steps'
-- allowed cases must change with them (tests/algorithm_props.rs and
-- tests/script_paths.rs compare the paths).
local function library()
  -- (For whole numbers below 2^53, (x - x % b) / b is floor(x / b)
  -- exactly, without a call: each math.* call cost a counter about 200-300
  -- of redis-server's instructions, under 1% of them. The numbers here
  -- are the script's own, bounded by the config's limits, or stored ones
  -- `decode` read as below 2^53.)
  local function ceil_div(a, b)
    local x = a + b - 1
    return (x - x % b) / b
  end

  -- Loading and saving ----------------------------------------------------
  -- v: the key's value from the MGET below (false when absent, or a key of
  -- another type, which reads as no counter and is overwritten by the first
  -- charge).
  local function decode(alg, key, W, v)
    if type(v) ~= 'string' then return nil end
    if alg == 0 then
      local r = window_credits(v)
      if not r then return nil end
      local ttl = rcall('PTTL', key)
      if ttl < 0 then return {r = r, e = now + W} end
      -- x: the key keeps this expiry, so a new count can be written with
      -- DECRBY, which leaves the TTL alone (much cheaper than SET ... PX).
      return {r = r, e = now + ttl, x = true}
    elseif alg == 1 then
      local s, c = string.match(v, '^(%d+):(%d+)$')
      if not s then return nil end
      return {s = tonumber(s), c = tonumber(c)}
    elseif alg == 2 then
      local s, p, c = string.match(v, '^(%d+):(%d+):(%d+)$')
      if not s then return nil end
      return {s = tonumber(s), p = tonumber(p), c = tonumber(c)}
    end
    local u, a = string.match(v, '^(%d+):(%d+)$')
    if not u then return nil end
    -- (divvy stores at most burst x window ms <= 2^52 used and a time in
    -- ms: a value beyond 2^53, someone else's, is no counter, as for
    -- divvy's window; the arithmetic below is exact only below it.)
    u, a = tonumber(u), tonumber(a)
    if u >= 9e15 or a >= 9e15 then return nil end
    return {u = u, a = a}
  end

  local function expires(alg, st, L, W)
    if alg == 0 then return st.e
    elseif alg == 1 then return st.s + W
    elseif alg == 2 then return st.s + 2 * W end
    return st.a + ceil_div(st.u, L)
  end

  local function encode(alg, st)
    if alg == 0 then return fmt(st.r)
    elseif alg == 1 then return fmt(st.s) .. ':' .. fmt(st.c)
    elseif alg == 2 then return fmt(st.s) .. ':' .. fmt(st.p) .. ':' .. fmt(st.c) end
    return fmt(st.u) .. ':' .. fmt(st.a)
  end

  -- The algorithms: each returns allowed, remaining, reset ms, next state --
  -- divvy's window: the stored credits count against the rule's own limit,
  -- sent as B; the limit in force L (a knob's) shifts them by L - B.
  local function window_step(st, L, W, B, cost, refund)
    if st == nil or st.e <= now then
      if not refund and cost > 0 and cost <= L then
        return 1, L - cost, W, {r = L - cost - (L - B), e = now + W}
      end
      return (refund or cost <= L) and 1 or 0, L, W, nil
    end
    local reset = st.e - now
    local shift = L - B
    local r = st.r + shift
    if refund then
      local left = min(r + cost, L)
      local v = left - shift
      return 1, max(left, 0), reset, (v ~= st.r) and {r = v, e = st.e} or nil
    end
    if cost == 0 then return (r > 0) and 1 or 0, max(r, 0), reset, nil end
    if r >= cost then
      local v = r - cost - shift
      return 1, r - cost, reset, (v ~= st.r) and {r = v, e = st.e} or nil
    end
    return 0, max(r, 0), reset, nil
  end

  local function fixed_current(st, W)
    local s0 = now - now % W
    if st ~= nil and st.s >= s0 then return st.s, st.c end
    return s0, 0
  end

  local function fixed_step(st, L, W, B, cost, refund)
    local s, c = fixed_current(st, W)
    local reset = max(s + W - now, 0)
    if refund then
      local left = max(c - cost, 0)
      return 1, max(L - left, 0), reset, (left ~= c) and {s = s, c = left} or nil
    end
    if cost == 0 then return (c < L) and 1 or 0, max(L - c, 0), reset, nil end
    if cost <= L and c <= L - cost then return 1, L - c - cost, reset, {s = s, c = c + cost} end
    return 0, max(L - c, 0), reset, nil
  end

  local function sliding_current(st, W)
    local s0 = now - now % W
    if st ~= nil then
      if st.s >= s0 then return st.s, st.p, st.c end
      if st.s + W == s0 then return s0, st.c, 0 end
    end
    return s0, 0, 0
  end

  local function first_time_weighing(p, k, W)
    if p <= k then return 0 end
    return max(W - floor(((k + 1) * W - 1) / p), 0)
  end

  local function sliding_step(st, L, W, B, cost, refund)
    local s, p, c = sliding_current(st, W)
    local e = min(max(now - s, 0), W - 1)
    local weighted = floor(min(p, L) * (W - e) / W)
    local used = weighted + c
    local reset = max(s + W - now, 0)
    if refund then
      local left = max(c - cost, 0)
      return 1, max(L - (weighted + left), 0), reset, (left ~= c) and {s = s, p = p, c = left} or nil
    end
    local need = max(cost, 1)
    if need <= L and used <= L - need then
      return 1, L - (used + cost), reset, (cost > 0) and {s = s, p = p, c = c + cost} or nil
    end
    local at
    if need > L then
      at = s + W
    elseif c + need <= L then
      at = s + first_time_weighing(min(p, L), L - c - need, W)
    else
      at = s + W + first_time_weighing(min(c, L), L - need, W)
    end
    return 0, max(L - used, 0), max(at - now, 1), nil
  end

  local function bucket_current(st, L)
    if st == nil then return 0, now end
    if now > st.a then
      local el = now - st.a
      if el >= ceil_div(st.u, L) then return 0, now end
      return st.u - el * L, now
    end
    return st.u, st.a
  end

  local function bucket_step(st, L, W, B, cost, refund)
    local used, at = bucket_current(st, L)
    local cap = B * W
    local ahead = at - now
    if ahead < 0 then ahead = 0 end
    if refund then
      local left = max(used - cost * W, 0)
      return 1, floor(max(cap - left, 0) / W), ahead + ceil_div(left, L),
        (left ~= used) and {u = left, a = at} or nil
    end
    local needc = (cost > 1) and cost or 1
    if needc > B then
      return 0, floor(max(cap - used, 0) / W), ahead + ceil_div(used, L), nil
    end
    local need = needc * W
    if used <= cap - need then
      local after = used
      if cost > 0 then after = used + need end
      local left = cap - after
      return 1, (left - left % W) / W, ahead + ceil_div(after, L),
        (cost > 0) and {u = after, a = at} or nil
    end
    return 0, floor(max(cap - used, 0) / W), ahead + ceil_div(used + need - cap, L), nil
  end

  local steps = {[0] = window_step, [1] = fixed_step, [2] = sliding_step, [3] = bucket_step}

  -- What a counter shows uncharged: credits left, ms until it is full.
  local function view(alg, st, L, W, B)
    local _, r, t = steps[alg](st, L, W, B, 0, false)
    if alg == 1 then
      local s = fixed_current(st, W)
      t = max(s + W - now, 0)
    elseif alg == 2 then
      local s = sliding_current(st, W)
      t = max(s + W - now, 0)
    elseif alg == 3 then
      local used, at = bucket_current(st, L)
      t = max(at - now, 0) + ceil_div(used, L)
    end
    return r, t
  end
  return decode, expires, encode, steps, view
end

-- Requests ----------------------------------------------------------------
local n = #KEYS
local shapes = tonumber(ARGV[2])
local hints = tonumber(ARGV[3])
local lone = hints % 2 == 1
local distinct = hints % 4 >= 2
local salg, slim, swin, sbur = {}, {}, {}, {}
for p = 1, shapes do
  local b = 4 * p - 1
  salg[p] = tonumber(ARGV[b + 1])
  slim[p] = tonumber(ARGV[b + 2])
  swin[p] = tonumber(ARGV[b + 3])
  sbur[p] = tonumber(ARGV[b + 4])
end
local base = 3 + 4 * shapes
-- The runs' numbers, and the general path's costs, are mostly the same few
-- texts ("132", "1"): each text is read once.
local number = setmetatable({}, {__index = function(t, text)
  local v = tonumber(text)
  t[text] = v
  return v
end})
-- The runs (see the top) must cover the keys exactly, each with a shape
-- of the call and a whole, finite cost; the store never sends anything
-- else, and a call that does is refused whole, before anything is read or
-- written.
-- `head(b)` reads the run whose head is ARGV[b + 1]: its length, shape and
-- flags, and cost as text; nothing for a malformed one. (`% 1` tests for
-- a whole number without a call to `math.floor`, and is not 0 for inf or
-- nan.) A lone call's runs are checked here, as the lean path writes as it
-- goes (such a call has few: one for a connection's pipelined HITs of one
-- rule); the others' as they are read into `xs`, before anything is read.
local RUN = 4294967296 -- 2^32: a run's length - 1 is counted in these
-- Each head text checked (its length and its shape and flags) and each cost
-- text checked (true), once a call: one rule's limits alternate a few
-- heads, and checking each again cost a call of them 2%.
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
    -- (Any whole cost: one beyond every limit is denied, as it always was.)
    if not (cost and cost >= 0 and cost % 1 == 0) then return end
    costok[tt] = true
  end
  return c, hx[th], tt
end
local function malformed() error('divvy: malformed runs of keys') end
if lone then
  local covered, b = 0, base
  while covered < n do
    local c = head(b)
    if not c then break end
    covered, b = covered + c, b + 2
  end
  if covered ~= n or ARGV[b + 1] ~= nil then malformed() end
end
-- `run()` moves to the next run of a lone call (checked above, so `head`
-- answers from its memo) and returns what `head` does.
local rb = base
local function run()
  rb = rb + 2
  return head(rb - 2)
end
-- Each key's shape and flags, and its cost as text (`xs`, `cts`, by op);
-- whether every group of the call is charged or checked on its own: no
-- request denied beforehand (16), no refund (32, 64), and no
-- all-or-nothing request (8) of more than one counter. Such a call
-- (requests of one counter or of one rule's limits, and a connection's
-- pipelined requests: most calls) takes the lean path. (With the hint that
-- every op is a lone counter, the call is lean: `xs` and `cts` stay empty,
-- and the lean path reads the runs as it goes.)
local xs, cts = {}, {}
local lean = true
local whole_request = false -- the request under way is all-or-nothing
local left, x, ct = 0, 0, nil -- the run under way: keys left in it, its numbers
local xb = base -- where the next run's head is
for i = 1, lone and 0 or n do
  if left == 0 then
    -- (`head` only for a text not seen yet in the call: calling it for
    -- every run cost 1.5% on a call of one rule's limits, a run a key.)
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
    lean = false
  elseif starts then
    whole_request = f >= 8
  elseif whole_request then
    lean = false
  end
end
if not lone and ARGV[xb + 1] ~= nil then malformed() end

-- Every value in one call (a few for very large calls: Lua unpacks at most
-- about 8,000 values at once).
local raw = {}
if n > 0 and n <= 4000 then
  raw = rcall('MGET', unpack(KEYS))
elseif n > 4000 then
  for from = 1, n, 4000 do
    local part = rcall('MGET', unpack(KEYS, from, min(from + 3999, n)))
    for i = 1, #part do raw[from + i - 1] = part[i] end
  end
end

-- The lean path: what the general one below does for groups charged on
-- their own, with no per-request tables. A lone counter of divvy's window,
-- the common case, is inline (no table per key, none of the algorithm
-- closures); so is a lone counter of another algorithm that is allowed
-- (one state table per key, built by the MGET's value and changed in place;
-- a denial takes the algorithms' own functions for when it is due again).
-- divvy's window is written at once (a key charged twice in one call is
-- written, and replicated, twice; a key is read from the MGET and PTTL
-- once, then from `credits` and `expiry`, so a write cannot change a later
-- answer); the other algorithms are saved once, at the end, as the general
-- path saves them (or at once, when the sender says no key of the call
-- comes twice). The general path writes only at its end; the store never sends a
-- call that can fail halfway (limits and windows are validated), and a
-- call is far too short for SCRIPT KILL.
if lean then
  local out = {}
  local j = 0
  -- divvy's window, by key: the credits stored (false: no counter) and the
  -- expiry in ms, negative while the key has no TTL and must be rewritten
  -- whole.
  local credits, expiry = {}, {}
  local decode, expires, encode, steps, view -- when needed
  local seen = {} -- other algorithms' states, by key (false: no counter)
  -- by key: the shape and flags (as `xs` holds them) of the op whose
  -- numbers save it; changed
  local owner, dirty = {}, {}
  local wtext = {} -- a shape's window in ms, as text
  -- By shape, for fixed and sliding windows: the current window's start as
  -- text and ':' (how its counters' values begin), and the ms its counters
  -- live after this call, as text (most counters of a call are in it).
  local wpre, wttl = {}, {}
  local function current(p)
    local pre = wpre[p]
    if not pre then
      local W = swin[p]
      local s0 = now - now % W
      pre = fmt(s0) .. ':'
      wpre[p] = pre
      wttl[p] = fmt(s0 + ((salg[p] == 2) and 2 * W or W) - now)
    end
    return pre
  end
  local over, before, ra, rr, rt, rn -- groups' working tables, when needed
  -- divvy's window `k` (op i) into `credits` and `expiry`, once.
  local function window_load(i, k, W)
    local s = credits[k]
    if s == nil then
      s = window_credits(raw[i])
      if s then
        local ttl = rcall('PTTL', k)
        if ttl < 0 then expiry[k] = -(now + W) else expiry[k] = now + ttl end
      end
      credits[k] = s
    end
    return s
  end
  -- divvy's window `k` charged from `s` credits (its expiry, and whether
  -- it must be rewritten whole, from `expiry`) to `v` ending at `e`: `DECRBY`
  -- in place where it can be, else `SET ... PX`.
  local function window_save(k, s, v, e)
    local was = expiry[k]
    -- (`was` is negative for a key without TTL: never equal to `e`.)
    if s and was == e then
      local done = rpcall('DECRBY', k, fmt(s - v))
      -- A value that is a number to Lua but not an integer to Redis is
      -- rewritten whole.
      if type(done) == 'table' and done.err then
        rcall('SET', k, fmt(v), 'PX', fmt(e - now))
      end
    else
      rcall('SET', k, fmt(v), 'PX', fmt(e - now))
    end
    credits[k], expiry[k] = v, e
  end
  -- Op o's limit shape: algorithm, limit, window ms, burst.
  local function shape(o)
    local x = xs[o]
    local p = (x - x % 128) / 128
    return salg[p], slim[p], swin[p], sbur[p]
  end
  -- Another algorithm's counter `k` saved as state `st`, with shape p's
  -- numbers. (`expires` and `encode` inline; every number here is at
  -- least 0, and one `format` writes the value where `fmt` would take '%d'
  -- for each.)
  local function save(k, p, st)
    local alg, L, W = salg[p], slim[p], swin[p]
    local ttl, v
    if alg ~= 3 and st.s == now - now % W and st.c < 9e15 and (alg == 1 or st.p < 9e15) and wide_d then
      -- A counter of the current window (most of them).
      local pre = current(p)
      if alg == 1 then v = pre .. format('%d', st.c) else v = pre .. format('%d:%d', st.p, st.c) end
      rcall('SET', k, v, 'PX', wttl[p])
      return
    elseif alg == 1 then
      ttl = st.s + W - now
      if wide_d and st.s < 9e15 and st.c < 9e15 then
        v = format('%d:%d', st.s, st.c)
      else
        v = fmt(st.s) .. ':' .. fmt(st.c)
      end
    elseif alg == 2 then
      ttl = st.s + 2 * W - now
      if wide_d and st.s < 9e15 and st.p < 9e15 and st.c < 9e15 then
        v = format('%d:%d:%d', st.s, st.p, st.c)
      else
        v = fmt(st.s) .. ':' .. fmt(st.p) .. ':' .. fmt(st.c)
      end
    else
      local due = st.u + L - 1
      ttl = st.a + (due - due % L) / L - now
      if wide_d and st.u < 9e15 and st.a < 9e15 then
        v = format('%d:%d', st.u, st.a)
      else
        v = fmt(st.u) .. ':' .. fmt(st.a)
      end
    end
    if ttl <= 0 then
      rcall('DEL', k)
    else
      rcall('SET', k, v, 'PX', fmt(ttl))
    end
  end
  -- Another algorithm's counter `k` (op o) as `seen` holds it, loaded once.
  local function other_load(o, k, alg, W)
    if not steps then decode, expires, encode, steps, view = library() end
    local st = seen[k]
    if st == nil then
      st = decode(alg, k, W, raw[o]) or false
      seen[k] = st
    end
    return st
  end
  local left, rx, rct = 0, 0, nil -- a lone call's run under way (see `run`)
  local i = 1
  while i <= n do
    -- ops i..g: one group (the ops after i with flag 1, in i's request)
    local g = i
    if not lone then
      while g < n and xs[g + 1] % 2 == 1 and xs[g + 1] % 8 < 4 do g = g + 1 end
    end
    if g == i then
      local x, ctext
      if lone then
        if left == 0 then left, rx, rct = run() end
        left = left - 1
        x, ctext = rx, rct
      else
        x, ctext = xs[i], cts[i]
      end
      local p = (x - x % 128) / 128
      local alg, L, W, B = salg[p], slim[p], swin[p], sbur[p]
      local cost = number[ctext]
      local k = KEYS[i]
      local a, r, t
      if alg == 0 then
        -- window_load and window_save inline (a call per key cost 2-4% of
        -- the script's time here; tests/script_paths.rs compares this path
        -- with the general one): a key read here is cached in `credits`
        -- and `expiry` once, with what it was read as or with what is
        -- written (`fresh`: read here and not written yet); not when no key
        -- of the call appears twice.
        local s
        if not distinct then s = credits[k] end
        local e, was, fresh -- the expiry; as `expiry` would hold it
        if s == nil then
          fresh = not distinct
          local v = raw[i]
          -- (MGET gives a string, or false: `type` is a call, and calls
          -- are what cost here.)
          s = v and tonumber(v) or false
          if s and (s ~= s or s >= 9e15 or s <= -9e15) then s = false end -- window_credits
          if s then
            local ttl = rcall('PTTL', k)
            if ttl < 0 then e = now + W; was = -e else e = now + ttl; was = e end
          end
        elseif s then
          was = expiry[k]
          e = (was < 0) and -was or was
        end
        if not s or e <= now then
          -- window_step of no counter, or of an expired one
          if cost > 0 and cost <= L then
            a, r, t = 1, L - cost, W
            local w = wtext[p]
            if not w then w = fmt(W); wtext[p] = w end
            rcall('SET', k, fmt(B - cost), 'PX', w)
            if not distinct then credits[k], expiry[k] = B - cost, now + W end
            fresh = false
          else
            a, r, t = (cost <= L) and 1 or 0, L, W
          end
        else
          t = e - now
          local have = s + (L - B)
          if cost == 0 then
            a, r = (have > 0) and 1 or 0, max(have, 0)
          elseif have >= cost then
            a, r = 1, have - cost
            -- As window_step computes it (beyond 2^53 the subtraction can
            -- round back to the value stored: nothing is written then).
            local v = have - cost - (L - B)
            if v ~= s then
              -- (`was` is negative for a key without TTL: never equal to `e`.)
              if was == e then
                local done = rpcall('DECRBY', k, ctext)
                -- A value that is a number to Lua but not an integer to
                -- Redis (an error table, never equal to a number), or a
                -- count Lua rounded, is rewritten whole.
                if done ~= v then
                  rcall('SET', k, fmt(v), 'PX', fmt(e - now))
                end
              else
                rcall('SET', k, fmt(v), 'PX', fmt(e - now))
              end
              if not distinct then credits[k], expiry[k] = v, e end
              fresh = false
            end
          else
            a, r = 0, max(have, 0)
          end
        end
        if fresh then credits[k], expiry[k] = s, was end
      else
        -- The other algorithms: what their steps do when the counter is
        -- allowed, inline (state tables changed in place: nothing else
        -- holds them between ops); a denial's answer (when the counter is
        -- due again) comes from the algorithms' own functions. `seen` holds
        -- the state, and `dirty` and `owner` what to save at the end, only
        -- where a key may come again in the call; else it is saved at once.
        local st, charged
        if not distinct then st = seen[k] end
        if st == nil then
          st = false
          local v = raw[i]
          if v then -- (MGET gives a string, or false)
            if alg == 1 then
              -- A counter of the current window: only its count to read.
              local pre = current(p)
              local c = find(v, pre, 1, true) == 1 and match(v, '^(%d+)$', #pre + 1)
              if c then
                st = {s = now - now % W, c = tonumber(c)}
              else
                local s
                s, c = match(v, '^(%d+):(%d+)$')
                if s then st = {s = tonumber(s), c = tonumber(c)} end
              end
            elseif alg == 2 then
              local pre = current(p)
              local q, c
              if find(v, pre, 1, true) == 1 then q, c = match(v, '^(%d+):(%d+)$', #pre + 1) end
              if q then
                st = {s = now - now % W, p = tonumber(q), c = tonumber(c)}
              else
                local s
                s, q, c = match(v, '^(%d+):(%d+):(%d+)$')
                if s then st = {s = tonumber(s), p = tonumber(q), c = tonumber(c)} end
              end
            else
              local u, at = match(v, '^(%d+):(%d+)$')
              if u then
                u, at = tonumber(u), tonumber(at)
                -- (beyond 2^53: no counter, as `decode` reads it)
                if u < 9e15 and at < 9e15 then st = {u = u, a = at} end
              end
            end
          end
          if not distinct then seen[k] = st end
        end
        if alg == 1 then
          -- fixed_step
          local s, c = now - now % W, 0
          if st and st.s >= s then c = st.c; s = st.s end
          if cost == 0 and c < L then
            a, r = 1, L - c
          elseif cost > 0 and cost <= L and c <= L - cost then
            a, r = 1, L - c - cost
            if st then st.s, st.c = s, c + cost else st = {s = s, c = c + cost}; if not distinct then seen[k] = st end end
            charged = true
          end
          -- (The window's start `s` is the current one's or later: t > 0.
          -- Here and below, the allowed cases make no math.* calls; see
          -- `ceil_div`.)
          t = s + W - now
        elseif alg == 2 then
          -- sliding_step
          local s, q, c = now - now % W, 0, 0
          if st then
            if st.s >= s then s, q, c = st.s, st.p, st.c
            elseif st.s + W == s then q = st.c end
          end
          local el = now - s
          if el < 0 then el = 0 elseif el >= W then el = W - 1 end
          local used = ((q < L) and q or L) * (W - el)
          used = (used - used % W) / W + c
          local need = (cost > 1) and cost or 1
          if need <= L and used <= L - need then
            a, r, t = 1, L - (used + cost), s + W - now
            if cost > 0 then
              if st then st.s, st.p, st.c = s, q, c + cost else st = {s = s, p = q, c = c + cost}; if not distinct then seen[k] = st end end
              charged = true
            end
          end
        else
          -- bucket_step
          local used, at = 0, now
          if st then
            if now <= st.a then
              used, at = st.u, st.a
            else
              local due = st.u + L - 1
              if now - st.a < (due - due % L) / L then used = st.u - (now - st.a) * L end
            end
          end
          local need = (cost > 1) and cost or 1
          if need <= B and used <= B * W - need * W then
            if cost > 0 then used = used + need * W end
            local room, due = B * W - used, used + L - 1
            -- (`at` is now or later here.)
            a, r, t = 1, (room - room % W) / W, at - now + (due - due % L) / L
            if cost > 0 then
              if st then st.u, st.a = used, at else st = {u = used, a = at}; if not distinct then seen[k] = st end end
              charged = true
            end
          end
        end
        if a ~= 1 then
          if not steps then decode, expires, encode, steps, view = library() end
          a, r, t = steps[alg](st or nil, L, W, B, cost, false)
        elseif distinct then
          if charged then save(k, p, st) end
        else
          owner[k] = x
          if charged then dirty[k] = true end
        end
      end
      out[j + 1], out[j + 2] = (a == 1) and r or -1 - r, t
      j = j + 2
    else
      -- A group (one rule's limits): every op on the state its keys have
      -- after the ops before it, then all charged or none; as the general
      -- path does it, with the algorithms' own functions.
      -- (The tables are the call's, made at its first group: `over` is
      -- emptied after each group; the others are by op, each written
      -- before it is read.)
      if not steps then decode, expires, encode, steps, view = library() end
      if not over then over, before, ra, rr, rt, rn = {}, {}, {}, {}, {}, {} end
      local all = true
      for o = i, g do
        local alg, L, W, B = shape(o)
        local k = KEYS[o]
        local st = over[k]
        if st == nil then
          if alg == 0 then
            local s = window_load(o, k, W)
            local e = s and expiry[k]
            st = s and {r = s, e = (e < 0) and -e or e} or false
          else
            st = other_load(o, k, alg, W)
          end
        end
        local a, r, t, nx = steps[alg](st or nil, L, W, B, number[cts[o]], false)
        if a ~= 1 then all = false end
        over[k] = nx or st
        before[o] = st
        ra[o], rr[o], rt[o], rn[o] = a, r, t, nx ~= nil
      end
      for o = i, g do
        local alg, L, W, B = shape(o)
        if all then
          local k = KEYS[o]
          local st = over[k]
          if alg == 0 then
            local s = credits[k]
            local e = expiry[k]
            if st and (st.r ~= s or not e or (st.e ~= e and st.e ~= -e)) then
              window_save(k, s, st.r, st.e)
            end
          else
            owner[k] = xs[o]
            if st ~= seen[k] then
              seen[k] = st
              dirty[k] = true
            end
          end
          out[j + 1], out[j + 2] = (ra[o] == 1) and rr[o] or -1 - rr[o], rt[o]
        elseif ra[o] == 1 and rn[o] then
          -- allowed alone, not charged: what the counter shows uncharged
          local r, t = view(alg, before[o] or nil, L, W, B)
          out[j + 1], out[j + 2] = r, t
        else
          out[j + 1], out[j + 2] = (ra[o] == 1) and rr[o] or -1 - rr[o], rt[o]
        end
        j = j + 2
      end
      for o = i, g do over[KEYS[o]] = nil end
    end
    i = g + 1
  end
  -- The other algorithms' counters are saved once, at the end, with the
  -- numbers of the last request that charged or checked them, as the
  -- general path saves them (at once, when no key of the call repeats).
  for k, _ in pairs(dirty) do
    local x = owner[k]
    save(k, (x - x % 128) / 128, seen[k])
  end
  return out
end

-- The general path: all-or-nothing requests of several counters (and the
-- groups in them), refunds, requests denied beforehand. Nothing is written
-- before the end.
local decode, expires, encode, steps, view = library()
local alg, lim, win, bur, cost, flags = {}, {}, {}, {}, {}, {}
for i = 1, n do
  local x = xs[i]
  local f = x % 128
  local p = (x - f) / 128
  alg[i], lim[i], win[i], bur[i] = salg[p], slim[p], swin[p], sbur[p]
  flags[i] = f
  cost[i] = number[cts[i]]
end

local stored = {}  -- key -> committed state (false: none)
local loaded = {}  -- key -> the state as read from Redis (false: none)
local owner = {}   -- key -> op whose numbers save it
local dirty = {}
local function load(o)
  local k = KEYS[o]
  local s = stored[k]
  if s == nil then
    s = decode(alg[o], k, win[o], raw[o]) or false
    stored[k] = s
    loaded[k] = s
  end
  return s or nil
end

local out = {}
local rs = 1
while rs <= n do
  local re = rs
  while re < n and not has(flags[re + 1], 4) do re = re + 1 end
  if re == rs and not has(flags[rs], 16) then
    -- One op, not denied (most requests): what the general path below does
    -- for it, without its per-request tables. Charged: saved; denied:
    -- nothing is charged, whatever the request's kind.
    local o = rs
    local k = KEYS[o]
    local f = flags[o]
    local a, r, t, nx = steps[alg[o]](load(o), lim[o], win[o], bur[o], cost[o], has(f, 32))
    if a == 1 then
      if nx and alg[o] == 0 and has(f, 64) and nx.r + (lim[o] - bur[o]) >= lim[o] then
        nx = {r = nx.r, e = now}
      end
      owner[k] = o
      if nx then
        stored[k] = nx
        dirty[k] = true
      end
    end
    out[#out + 1] = (a == 1) and r or -1 - r
    out[#out + 1] = t
    rs = rs + 1
  else
    local aon = has(flags[rs], 8) or has(flags[rs], 16)
    local blocked = has(flags[rs], 16)
    local charged_state, before, charged = {}, {}, {}
    local ra, rr, rt, rn = {}, {}, {}, {}
    local i = rs
    while i <= re do
      local j = i
      while j < re and has(flags[j + 1], 1) do j = j + 1 end
      local overlay = {}
      local all = true
      for o = i, j do
        local k = KEYS[o]
        local st = overlay[k]
        if st == nil then st = charged_state[k] end
        if st == nil then st = load(o) or false end
        local s = st or nil
        local a, r, t, nx = steps[alg[o]](s, lim[o], win[o], bur[o], cost[o], has(flags[o], 32))
        if nx and alg[o] == 0 and has(flags[o], 64) and nx.r + (lim[o] - bur[o]) >= lim[o] then
          nx = {r = nx.r, e = now}
        end
        if a ~= 1 then all = false end
        overlay[k] = nx or st
        before[o] = st
        ra[o], rr[o], rt[o], rn[o] = a, r, t, nx ~= nil
      end
      if all then
        for k, v in pairs(overlay) do charged_state[k] = v end
        for o = i, j do charged[o] = true; owner[KEYS[o]] = o end
      elseif aon and not has(flags[i], 2) then
        blocked = true
      end
      i = j + 1
    end
    for o = rs, re do
      if ra[o] == 1 and rn[o] and (blocked or not charged[o]) then
        local st
        if blocked then st = load(o) else st = before[o] or nil end
        local r, t = view(alg[o], st, lim[o], win[o], bur[o])
        out[#out + 1] = r
        out[#out + 1] = t
      else
        out[#out + 1] = (ra[o] == 1) and rr[o] or -1 - rr[o]
        out[#out + 1] = rt[o]
      end
    end
    if not blocked then
      for k, v in pairs(charged_state) do
        if v and v ~= stored[k] then
          stored[k] = v
          dirty[k] = true
        end
      end
    end
    rs = re + 1
  end
end

for k, _ in pairs(dirty) do
  local o = owner[k]
  local st = stored[k]
  local ttl = expires(alg[o], st, lim[o], win[o]) - now
  local was = loaded[k]
  if ttl <= 0 then
    rcall('DEL', k)
  elseif alg[o] == 0 and was and was.x and was.e == st.e then
    -- divvy's window, same expiry: only the credits change. A value that
    -- is a number to Lua but not an integer to Redis is rewritten whole.
    if was.r ~= st.r then
      local done = rpcall('DECRBY', k, fmt(was.r - st.r))
      if type(done) == 'table' and done.err then
        rcall('SET', k, encode(0, st), 'PX', fmt(ttl))
      end
    end
  else
    rcall('SET', k, encode(alg[o], st), 'PX', fmt(ttl))
  end
end
return out
