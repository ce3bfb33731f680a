-- The general path (lone.lua returns before it): groups (one rule's
-- limits, charged all or none), all-or-nothing requests of several counters, refunds, requests denied
-- beforehand. States are tables {s1, s2, s3} (false: none) by key here;
-- nothing is written before the end. An op's shape p and flags f are in
-- xs[o] = p * 128 + f (so xs[o] % 2 == f % 2, and so on). KEYS, ARGV: see
-- prelude.lua.

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
-- Op o's step on state `st`: allowed, left, reset, the new state or nil,
-- and whether it fills (`may`: the op is charged on its own).
local function step(o, st, may)
  local x = xs[o]
  local f = x % 128
  local p = (x - f) / 128
  st = st or NONE
  local A, L, W, B, cost = algorithms[salg[p]], slim[p], swin[p], sbur[p], number[cts[o]]
  local a, r, t, n1, n2, n3 = A.step(st[1], st[2], st[3], L, W, B, cost, f >= 32, f >= 64)
  if a ~= 1 and sover[p] and f < 32 then
    local oa, orr, ot, o1, o2, o3 = overdrawn(A, st[1], st[2], st[3], L, W, B, cost, r,
      salg[p] == 3, may)
    -- allowed, or denied and charged alone ("fills"), or denied uncharged;
    -- then the credits past what was left, if charged
    if oa == 1 then return 1, orr, ot, {o1, o2, o3}, false, cost - r end
    if oa and o1 ~= nil then return 0, orr, ot, {o1, o2, o3}, true, cost - r end
    if oa then return 0, orr, ot, nil end
  end
  if a ~= 1 and may and sfill[p] and f < 32 then
    local ft, fr, f1, f2, f3 = filled(A, st[1], st[2], st[3], L, W, B, cost, r)
    if ft then return a, fr, ft, {f1, f2, f3}, true end
  end
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
local before, charged, ra, rr, rt, rn, rp = {}, {}, {}, {}, {}, {}, {}
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
      local a, r, t, nx, fills, pc = step(o, st, i == g and not aon)
      if a ~= 1 and not fills then all = false end
      overlay[k] = nx or st
      before[o] = st
      ra[o], rr[o], rt[o], rn[o], rp[o] = a, r, t, nx ~= nil, pc
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
      if rp[o] and charged[o] and not blocked then overdrew(o, rp[o]) end
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
    local a, r, t, nx, fills, pc = step(rs, load(rs), xs[rs] % 16 < 8)
    if (a == 1 or fills) and nx then stored[k], dirty[k], owner[k] = nx, true, rs end
    if pc and nx then overdrew(rs, pc) end
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
return with_past(out)
