-- The lean path (prelude.lua's `lone` calls): every op a lone counter,
-- charged or checked on its own. Joined after the algorithm files and
-- before driver.lua (the general path), which it returns before.
-- KEYS, ARGV: see prelude.lua.
-- The calls: every op through its algorithm's functions, each algorithm's
-- built the first time a call needs it. Every algorithm file builds:
--   read(k, v, W): the state in the key's value v (MGET's string, or
--     false), up to 3 numbers; nothing for no counter;
--   step(s1, s2, s3, L, W, B, cost, refund, undo): allowed (1 or 0),
--     credits left, ms to reset, and the state to store (nothing: none);
--   view(s1, s2, s3, L, W, B): credits left and ms until full, uncharged;
--   save(k, s1, s2, s3, L, W, r1, r2, r3): writes the state over the one
--     stored (as `read` gave it, or as last saved; r1 nil or false: none);
-- and all but the token bucket run(i, last, L, W, B, cost, ct, out, j): a
-- lone run of distinct keys, one shape, answered into `out` (see
-- window.lua). A state's first number is nil or false for no counter.
-- Each algorithm file puts its builder in `build` under its number (see
-- prelude.lua).

-- A hit of algorithm A denied with r credits left on state s1-s3, when
-- its op fills (src/store/mod.rs, CounterOp::fill: an op charged on its
-- own): the r credits taken instead. The reset a retry of the hit would
-- get, the credits left after, and the state to store; nothing where
-- filling takes nothing.
local function filled(A, s1, s2, s3, L, W, B, cost, r)
  if r <= 0 or cost <= 0 then return end
  local a, left, _, n1, n2, n3 = A.step(s1, s2, s3, L, W, B, r, false)
  if a ~= 1 or n1 == nil then return end
  local _, _, t = A.step(n1, n2, n3, L, W, B, cost, false)
  return t, left, n1, n2, n3
end

-- A hit of algorithm A denied with r credits left on state s1-s3, when its
-- op overdraws (src/store/algorithm/mod.rs, `overdrawn`; `hb`: A holds a
-- burst): allowed if r > 0, the full cost charged past what is left when
-- allowed or `alone`, by A's own step with room for any debt (up to where
-- the arithmetic stays exact). Allowed (1 or 0), credits left, ms to reset,
-- the state to store; nothing where it does not apply.
local MAXL, MAXMS = 9007199254740991, 4503599627370496
-- (op, credits) of each op charged past what was left, appended to the
-- answer after its 2 values per key (src/store/redis/cluster.rs reads them).
local past = {}
local function overdrew(o, credits)
  if credits > 0 then
    local m = #past
    past[m + 1], past[m + 2] = o, credits
  end
end
-- The answer as one MessagePack array (Redis's `cmsgpack`): one bulk
-- string costs divvy a fraction of what an array of integer replies does
-- to read, and Redis about the same to write (docs/performance.md).
local function packed(out) return cmsgpack.pack(out) end
local function with_past(out)
  local m = #out
  for q = 1, #past do out[m + q] = past[q] end
  return packed(out)
end
local function overdrawn(A, s1, s2, s3, L, W, B, cost, r, hb, alone)
  if cost <= 0 then return end
  if r <= 0 and not alone then
    local _, _, t = A.step(s1, s2, s3, L, W, B, 1, false)
    return 0, 0, t
  end
  local L2, B2 = max(MAXL, L), B
  if hb then L2, B2 = L, max((MAXMS - MAXMS % W) / W, B) end
  local a, _, _, n1, n2, n3 = A.step(s1, s2, s3, L2, W, B2, cost, false)
  if a ~= 1 or n1 == nil then return end
  local left, t = A.view(n1, n2, n3, L, W, B)
  if r <= 0 then _, _, t = A.step(n1, n2, n3, L, W, B, 1, false) end
  return (r > 0) and 1 or 0, left, t, n1, n2, n3
end

local algorithms = setmetatable({}, {__index = function(t, a)
  local A = build[a]()
  t[a] = A
  return A
end})

-- The lone path: every op a counter charged or checked on its own (most
-- calls), on plain numbers, its runs read as it goes; each counter written
-- at once when charged. When a key may come twice, its state is kept by
-- the op that first read it (`first`): now (S1-S3) and as stored (R1-R3).
local function lone_path()
  local out, j = {}, 0
  local first, S1, S2, S3, R1, R2, R3
  if not distinct then first, S1, S2, S3, R1, R2, R3 = {}, {}, {}, {}, {}, {}, {} end
  -- The run under way: keys left in it, its shape's numbers and functions.
  -- An algorithm's `run` takes a whole run of distinct keys (with a key
  -- twice, the state an earlier op left is kept here, in `first`).
  local left, rb, i, L, W, B, cost, A, read, step, save, fl, ov, hb, al = 0, base, 1
  while i <= n do
    if left == 0 then
      local x, ct
      left, x = head(rb)
      local p = (x - x % 128) / 128
      ct = ARGV[rb + 2]
      L, W, B, cost = slim[p], swin[p], sbur[p], number[ct]
      A = algorithms[salg[p]]
      read, step, save = A.read, A.step, A.save
      -- (not in an all-or-nothing request: flag 8)
      al = x % 16 < 8
      fl = sfill[p] and al
      ov, hb = sover[p], salg[p] == 3
      rb = rb + 2
      if A.run and not first and not sfill[p] and not ov then
        j = A.run(i, i + left - 1, L, W, B, cost, ct, out, j)
        i, left = i + left, 0
      end
    end
    if left > 0 then
      left = left - 1
      local k = KEYS[i]
      local a1, a2, a3, f
      if first then
        f = first[k]
        if f == nil then
          f = i
          first[k] = i
          a1, a2, a3 = read(k, raw[i], W)
          a1, a2, a3 = a1 or false, a2 or false, a3 or false
          S1[i], S2[i], S3[i], R1[i], R2[i], R3[i] = a1, a2, a3, a1, a2, a3
        else
          a1, a2, a3 = S1[f], S2[f], S3[f]
        end
      else
        a1, a2, a3 = read(k, raw[i], W)
      end
      local a, r, t, n1, n2, n3 = step(a1, a2, a3, L, W, B, cost, false)
      if a ~= 1 and ov then
        local oa, orr, ot, o1, o2, o3 = overdrawn(A, a1, a2, a3, L, W, B, cost, r, hb, al)
        if oa and o1 ~= nil then overdrew(i, cost - r) end
        if oa then a, r, t, n1, n2, n3 = oa, orr, ot, o1, o2, o3 end
      elseif a ~= 1 and fl then
        local ft, fr, f1, f2, f3 = filled(A, a1, a2, a3, L, W, B, cost, r)
        if ft then r, t, n1, n2, n3 = fr, ft, f1, f2, f3 end
      end
      if n1 ~= nil then
        if first then
          save(k, n1, n2, n3, L, W, R1[f], R2[f], R3[f])
          S1[f], S2[f], S3[f], R1[f], R2[f], R3[f] = n1, n2, n3, n1, n2, n3
        else
          save(k, n1, n2, n3, L, W, a1, a2, a3)
        end
      end
      out[j + 1], out[j + 2] = (a == 1) and r or -1 - r, t
      j = j + 2
      i = i + 1
    end
  end
  return with_past(out)
end
if lone then return lone_path() end
