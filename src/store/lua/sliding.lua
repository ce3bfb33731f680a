-- The sliding window (algorithm 2; src/store/algorithm/sliding.rs): the
-- current window's count plus the previous one's, weighed by how much of
-- it still overlaps the last window-length of time.
-- Reads: its key's value (MGET), PTTL on a lone charge. Writes: SET value
-- PX ttl (DEL once over); a lone charge in the window, SETRANGE of the
-- count where the expiry is already right (prelude's `rewrite`).
-- Stored value: "start:prev:cur", the current window's start in epoch ms
-- and the credits used in the previous and the current window; it lives
-- two windows from its start. State: s, p, c.
-- KEYS, ARGV: see prelude.lua.
build[2] = function()
  local A = {}

  -- The state in `v` (a string, or false); nothing for no counter.
  function A.read(_, v)
    local s, p, c = match(v or '', '^(%d+):(%d+):(%d+)$')
    if s then return tonumber(s), tonumber(p), tonumber(c) end
  end

  -- The current window's start and the previous and current counts.
  local function current(s, p, c, W)
    local s0 = now - now % W
    if s then
      if s >= s0 then return s, p, c end
      if s + W == s0 then return s0, c, 0 end
    end
    return s0, 0, 0
  end

  -- Ms into a window at which the previous count `p`, weighed down, leaves
  -- room for `k` more.
  local function first_time_weighing(p, k, W)
    if p <= k then return 0 end
    return max(W - floor(((k + 1) * W - 1) / p), 0)
  end

  -- Op on state s, p, c (see window.lua's A.step for what it returns).
  function A.step(s, p, c, L, W, _, cost, refund)
    s, p, c = current(s, p, c, W)
    -- (min and max spelled out: a math.* call costs a few hundred
    -- instructions)
    local e, m, reset = now - s, p, s + W - now
    if e < 0 then e = 0 elseif e > W - 1 then e = W - 1 end
    if L < p then m = L end
    if reset < 0 then reset = 0 end
    local weighted = floor(m * (W - e) / W)
    local used = weighted + c
    if refund then
      local left = max(c - cost, 0)
      if left == c then return 1, max(L - (weighted + left), 0), reset end
      return 1, max(L - (weighted + left), 0), reset, s, p, left
    end
    local need = (cost < 1) and 1 or cost
    if need <= L and used <= L - need then
      if cost == 0 then return 1, L - used, reset end
      return 1, L - (used + cost), reset, s, p, c + cost
    end
    local at
    if need > L then
      at = s + W
    elseif c + need <= L then
      at = s + first_time_weighing(min(p, L), L - c - need, W)
    else
      at = s + W + first_time_weighing(min(c, L), L - need, W)
    end
    return 0, max(L - used, 0), max(at - now, 1)
  end

  -- Credits left, and ms until the current window ends.
  function A.view(s, p, c, L, W, B)
    local _, r = A.step(s, p, c, L, W, B, 0, false)
    s = current(s, p, c, W)
    return r, max(s + W - now, 0)
  end

  -- Lone ops (no refunds) on keys i..last, one shape, for the lean path
  -- (see window.lua's A.run): a value of the current window (its start's
  -- text, ':', two counts) is read inline, and a charge that only adds to
  -- its count is written over the old one (prelude's `rewrite`) where the
  -- value is as `save` writes it; the rest through read and save.
  local byte = string.byte
  function A.run(i, last, L, W, B, cost, _, out, j)
    local s0 = now - now % W
    local ttl = s0 + 2 * W - now
    local pre = texts[s0] .. ':'
    local pat = '^' .. pre .. '(%d+):(%d+)$'
    for i = i, last do
      local k, v = KEYS[i], raw[i]
      local ps, cs, s, p, c
      if wide_d and v then ps, cs = match(v, pat) end
      if ps then s, p, c = s0, ps + 0, cs + 0 else s, p, c = A.read(k, v) end
      local a, r, t, n1, n2, n3 = A.step(s, p, c, L, W, B, cost, false)
      if n1 == nil then
      elseif ps and n1 == s0 and n2 == p and p < 9e15 and n3 < 9e15 and n3 > c
        and (ps == '0' or byte(ps) ~= 48) then
        rewrite(k, v, pre .. ps .. ':', format('%d', n3), ttl)
      else
        A.save(k, n1, n2, n3, L, W)
      end
      out[j + 1], out[j + 2] = (a == 1) and r or -1 - r, t
      j = j + 2
    end
    return j
  end

  function A.save(k, s, p, c, _, W)
    local tail
    if wide_d and p < 9e15 and c < 9e15 then tail = format('%d:%d', p, c) else tail = fmt(p) .. ':' .. fmt(c) end
    put(k, texts[s] .. ':' .. tail, s + 2 * W - now)
  end
  return A
end
