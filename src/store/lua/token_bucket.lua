-- The token bucket (algorithm 3; src/store/algorithm/token_bucket.rs, GCRA):
-- B credits of capacity (the burst), refilled L credits a window.
-- Reads: its key's value (MGET). Writes: SET value PX ttl (DEL once full).
-- Stored value: "used:at", the used capacity in credits x window ms and
-- the epoch ms it is valid at; it lives until the bucket is full again.
-- divvy keeps burst x window ms <= 2^52, so the arithmetic is exact; a
-- value beyond 2^53 is someone else's, and no counter. State: u, a.
-- KEYS, ARGV: see prelude.lua.
build[3] = function()
  local A = {}

  -- The state in `v` (a string, or false); nothing for no counter.
  function A.read(_, v)
    local u, a = match(v or '', '^(%d+):(%d+)$')
    if not u then return end
    u, a = tonumber(u), tonumber(a)
    if u < 9e15 and a < 9e15 then return u, a end
  end

  -- The used capacity as of now, and the time it is valid at (a charge
  -- ahead of time leaves `at` in the future).
  local function current(u, a, L)
    if not u then return 0, now end
    if now > a then
      local el = now - a
      if el >= ceil_div(u, L) then return 0, now end
      return u - el * L, now
    end
    return u, a
  end

  -- Op on state u, a (see window.lua's A.step for what it returns).
  function A.step(u, a, _, L, W, B, cost, refund)
    local used, at = current(u, a, L)
    local cap = B * W
    local ahead = at - now
    if ahead < 0 then ahead = 0 end
    if refund then
      local left = max(used - cost * W, 0)
      local r, t = floor(max(cap - left, 0) / W), ahead + ceil_div(left, L)
      if left == used then return 1, r, t end
      return 1, r, t, left, at
    end
    local needc = (cost > 1) and cost or 1
    if needc > B then
      return 0, floor(max(cap - used, 0) / W), ahead + ceil_div(used, L)
    end
    local need = needc * W
    if used <= cap - need then
      if cost == 0 then
        local left = cap - used
        return 1, (left - left % W) / W, ahead + ceil_div(used, L)
      end
      local after = used + need
      local left = cap - after
      return 1, (left - left % W) / W, ahead + ceil_div(after, L), after, at
    end
    return 0, floor(max(cap - used, 0) / W), ahead + ceil_div(used + need - cap, L)
  end

  -- Credits left, and ms until the bucket is full.
  function A.view(u, a, _, L, W, B)
    local _, r = A.step(u, a, nil, L, W, B, 0, false)
    local used, at = current(u, a, L)
    return r, max(at - now, 0) + ceil_div(used, L)
  end

  function A.save(k, u, a, _, L)
    put(k, fmt(u) .. ':' .. texts[a], a + ceil_div(u, L) - now)
  end
  return A
end
