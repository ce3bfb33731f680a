-- The fixed window (algorithm 1; src/store/algorithm/fixed.rs): windows
-- aligned to the epoch, each with its own count.
-- Reads: its key's value (MGET), PTTL on a lone charge. Writes: SET value
-- PX ttl (DEL once over); a lone charge in the window, SETRANGE of the
-- count where the expiry is already right (prelude's `rewrite`).
-- Stored value: "start:count", the window's start in epoch ms and the
-- credits used in it; it lives until the window ends. State: s, c.
-- KEYS, ARGV: see prelude.lua.
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

  -- Lone ops (no refunds) on keys i..last, one shape, for the lean path
  -- (see window.lua's A.run): a charge allowed in the current window (the
  -- value MGET read is its start's text, ':', a count) is A.step's allowed
  -- branch inline, its count written over the old (prelude's `rewrite`);
  -- the rest go through read, step and save.
  function A.run(i, last, L, W, B, cost, _, out, j)
    local s0 = now - now % W
    local ttl = s0 + W - now
    local pre = texts[s0] .. ':'
    local pat = '^' .. pre .. '(%d+)$'
    -- (below 2e15 every sum here is exact, and '%d' formats it)
    local quick = wide_d and cost > 0 and cost <= L and L < 2e15
    for i = i, last do
      local k, v = KEYS[i], raw[i]
      local c = quick and v and match(v, pat)
      if c then c = c + 0 end
      if c and c <= L - cost then
        c = c + cost
        rewrite(k, v, pre, format('%d', c), ttl)
        out[j + 1], out[j + 2] = L - c, ttl
      else
        local s, n
        s, c = A.read(k, v)
        local a, r, t
        a, r, t, s, n = A.step(s, c, nil, L, W, B, cost, false)
        if s ~= nil then A.save(k, s, n, nil, L, W) end
        out[j + 1], out[j + 2] = (a == 1) and r or -1 - r, t
      end
      j = j + 2
    end
    return j
  end

  function A.save(k, s, c, _, _, W)
    put(k, texts[s] .. ':' .. fmt(c), s + W - now)
  end
  return A
end
