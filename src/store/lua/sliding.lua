-- The sliding window (algorithm 2; src/store/algorithm/sliding.rs): the
-- current window's count plus the previous one's, weighed by how much of
-- it still overlaps the last window-length of time.
-- Reads: its key's value (MGET). Writes: SET value PX ttl (DEL once over).
-- Stored value: "start:prev:cur", the current window's start in epoch ms
-- and the credits used in the previous and the current window; it lives
-- two windows from its start. State: s, p, c.
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
    local e = min(max(now - s, 0), W - 1)
    local weighted = floor(min(p, L) * (W - e) / W)
    local used = weighted + c
    local reset = max(s + W - now, 0)
    if refund then
      local left = max(c - cost, 0)
      if left == c then return 1, max(L - (weighted + left), 0), reset end
      return 1, max(L - (weighted + left), 0), reset, s, p, left
    end
    local need = max(cost, 1)
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

  function A.save(k, s, p, c, _, W)
    local tail
    if wide_d and p < 9e15 and c < 9e15 then tail = format('%d:%d', p, c) else tail = fmt(p) .. ':' .. fmt(c) end
    put(k, texts[s] .. ':' .. tail, s + 2 * W - now)
  end
  return A
end
