-- The calls: every op through its algorithm's functions, each algorithm's
-- built the first time a call needs it. Every algorithm file builds:
--   read(k, v, W): the state in the key's value v (MGET's string, or
--     false), up to 3 numbers; nothing for no counter;
--   step(s1, s2, s3, L, W, B, cost, refund, undo): allowed (1 or 0),
--     credits left, ms to reset, and the state to store (nothing: none);
--   view(s1, s2, s3, L, W, B): credits left and ms until full, uncharged;
--   save(k, s1, s2, s3, L, W, r1, r2, r3): writes the state over the one
--     stored (as `read` gave it, or as last saved; r1 nil or false: none).
-- A state's first number is nil or false for no counter. Each algorithm
-- file puts its builder in `build` under its number (see prelude.lua).
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
  local left, rb, p, L, W, B, cost, read, step, save = 0, base
  for i = 1, n do
    if left == 0 then
      local x
      left, x = head(rb)
      p = (x - x % 128) / 128
      L, W, B, cost = slim[p], swin[p], sbur[p], number[ARGV[rb + 2]]
      local A = algorithms[salg[p]]
      read, step, save = A.read, A.step, A.save
      rb = rb + 2
    end
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
  end
  return out
end
if lone then return lone_path() end

-- The general path: groups (one rule's limits, charged all or none),
-- all-or-nothing requests of several counters, refunds, requests denied
-- beforehand. States are tables {s1, s2, s3} (false: none) by key here;
-- nothing is written before the end. An op's shape p and flags f are in
-- xs[o] = p * 128 + f (so xs[o] % 2 == f % 2, and so on).

-- By key: the committed state and the one read (false: none), the last op
-- that changed it, whose numbers save it (as the lone path saves it at
-- once), whether it changed.
local stored, loaded, owner, dirty = {}, {}, {}, {}
local NONE = {}
-- Op o's counter: its committed state, or as read (false: none).
local function load(o)
  local k = KEYS[o]
  local s = stored[k]
  if s == nil then
    local x = xs[o]
    local p = (x - x % 128) / 128
    local a1, a2, a3 = algorithms[salg[p]].read(k, raw[o], swin[p])
    s = (a1 ~= nil) and {a1, a2, a3} or false
    stored[k], loaded[k] = s, s
  end
  return s
end
-- Op o's step on state `st`: allowed, left, reset, and the new state or nil.
local function step(o, st)
  local x = xs[o]
  local f = x % 128
  local p = (x - f) / 128
  st = st or NONE
  local a, r, t, n1, n2, n3 = algorithms[salg[p]].step(st[1], st[2], st[3], slim[p], swin[p],
    sbur[p], number[cts[o]], f >= 32, f >= 64)
  if n1 ~= nil then return a, r, t, {n1, n2, n3} end
  return a, r, t, nil
end
local function view(o, st)
  local x = xs[o]
  local p = (x - x % 128) / 128
  st = st or NONE
  return algorithms[salg[p]].view(st[1], st[2], st[3], slim[p], swin[p], sbur[p])
end

local out, j = {}, 0
-- A request's working tables, the call's: by op (each written before it is
-- read), and by key (emptied after each group and request): tables a
-- request cost a group of two counters a third of its time.
local before, charged, ra, rr, rt, rn = {}, {}, {}, {}, {}, {}
local charged_state, overlay = {}, {}
-- Ops rs..re: one request (an op that starts one, and those up to the next).
local function request(rs, re)
  local f = xs[rs] % 128
  local blocked = f % 32 >= 16
  local aon = blocked or f % 16 >= 8
  local i = rs
  while i <= re do
    local g = i
    while g < re and xs[g + 1] % 2 == 1 do g = g + 1 end
    local all = true
    for o = i, g do
      local k = KEYS[o]
      local st = overlay[k]
      if st == nil then st = charged_state[k] end
      if st == nil then st = load(o) end
      local a, r, t, nx = step(o, st)
      if a ~= 1 then all = false end
      overlay[k] = nx or st
      before[o] = st
      ra[o], rr[o], rt[o], rn[o] = a, r, t, nx ~= nil
    end
    for o = i, g do
      local k = KEYS[o]
      local v = overlay[k]
      -- (nil: a key twice in the group, already moved)
      if all and v ~= nil then charged_state[k] = v end
      if all and rn[o] then owner[k] = o end
      charged[o] = all
      overlay[k] = nil
    end
    if not all and aon and xs[i] % 4 < 2 then blocked = true end
    i = g + 1
  end
  for o = rs, re do
    if ra[o] == 1 and rn[o] and (blocked or not charged[o]) then
      -- allowed alone, not charged: what the counter shows uncharged
      local st = before[o]
      if blocked then st = load(o) end
      out[j + 1], out[j + 2] = view(o, st)
    else
      out[j + 1], out[j + 2] = (ra[o] == 1) and rr[o] or -1 - rr[o], rt[o]
    end
    j = j + 2
    -- (`load` above reads `stored` only when blocked: nothing changes then.)
    local k = KEYS[o]
    local v = charged_state[k]
    if v and not blocked and v ~= stored[k] then stored[k], dirty[k] = v, true end
    charged_state[k] = nil
  end
end

local rs = 1
while rs <= n do
  local re = rs
  while re < n and xs[re + 1] % 8 < 4 do re = re + 1 end
  if re == rs and xs[rs] % 32 < 16 then
    -- One op, not denied: what `request` does for it, without its tables.
    local k = KEYS[rs]
    local a, r, t, nx = step(rs, load(rs))
    if a == 1 and nx then stored[k], dirty[k], owner[k] = nx, true, rs end
    out[j + 1], out[j + 2] = (a == 1) and r or -1 - r, t
    j = j + 2
  else
    request(rs, re)
  end
  rs = re + 1
end

for k in pairs(dirty) do
  local o = owner[k]
  local x = xs[o]
  local p = (x - x % 128) / 128
  local st, was = stored[k], loaded[k] or NONE
  algorithms[salg[p]].save(k, st[1], st[2], st[3], slim[p], swin[p], was[1], was[2], was[3])
end
return out
