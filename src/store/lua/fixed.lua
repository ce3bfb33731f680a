-- The fixed window (algorithm 1; src/store/algorithm/fixed.rs): windows
-- aligned to the epoch, each with its own count.
-- Reads: its key's value (MGET). Writes: SET value PX ttl (DEL once over).
-- Stored value: "start:count", the window's start in epoch ms and the
-- credits used in it; it lives until the window ends. State: s, c.
build[1] = function()
  local A = {}

  -- The state in `v` (a string, or false); nothing for no counter.
  function A.read(_, v)
    local s, c = match(v or '', '^(%d+):(%d+)$')
    if s then return tonumber(s), tonumber(c) end
  end

  -- The counted window: the stored one if it is the current one or later.
  local function current(s, c, W)
    local s0 = now - now % W
    if s and s >= s0 then return s, c end
    return s0, 0
  end

  -- Op on state s, c (see window.lua's A.step for what it returns).
  function A.step(s, c, _, L, W, _, cost, refund)
    s, c = current(s, c, W)
    local reset = s + W - now
    if reset < 0 then reset = 0 end
    if refund then
      local left = max(c - cost, 0)
      if left == c then return 1, max(L - left, 0), reset end
      return 1, max(L - left, 0), reset, s, left
    end
    if cost == 0 then return (c < L) and 1 or 0, max(L - c, 0), reset end
    if cost <= L and c <= L - cost then return 1, L - c - cost, reset, s, c + cost end
    return 0, max(L - c, 0), reset
  end

  -- Credits left, and ms until the counted window ends.
  function A.view(s, c, _, L, W, B)
    local _, r = A.step(s, c, nil, L, W, B, 0, false)
    s = current(s, c, W)
    return r, max(s + W - now, 0)
  end

  function A.save(k, s, c, _, _, W)
    put(k, texts[s] .. ':' .. fmt(c), s + W - now)
  end
  return A
end
