-- divvy's window (algorithm 0; src/store/algorithm/window.rs): it opens at
-- a counter's first charged hit and lasts the window.
-- Reads: its key's value (MGET) and PTTL. Writes: SET value PX ttl, or
-- DECRBY in place where the expiry stays (cheaper, and leaves the TTL).
-- Stored value: the credits left, counted against the rule's own limit
-- (sent as the burst B), with the window as the key's TTL: divvy's own
-- layout. State: r (those credits), e (epoch ms the window ends), and w: e
-- when the key has a TTL, -e when it has none and must be written whole.
-- Every algorithm file builds the same five functions (see lone.lua).
-- KEYS, ARGV: see prelude.lua.
build[0] = function()
  local A = {}

  -- The state in `v` (a string, or false); nothing for no counter: not a
  -- number, or one beyond 2^53 either way, inf or nan (someone else's
  -- value, which Redis would return as a wrong integer).
  function A.read(k, v, W)
    local r = v and tonumber(v)
    if not r or r ~= r or r >= 9e15 or r <= -9e15 then return end
    local ttl = rcall('PTTL', k)
    if ttl < 0 then return r, now + W, -(now + W) end
    return r, now + ttl, now + ttl
  end

  -- Op (limit L in force, window W, own limit B, cost) on state r, e, w:
  -- allowed (1 or 0), credits left, ms to reset, and the state to store
  -- (nothing: none changed). The credits in force are r + L - B. `undo`:
  -- a refund undoing a charge a denial elsewhere voided; a window given
  -- back its full credits ends now, as that charge had opened it.
  function A.step(r, e, w, L, W, B, cost, refund, undo)
    if not r or e <= now then
      if not refund and cost > 0 and cost <= L then
        -- (w: the TTL its save sets, so a later save in the call decrements)
        return 1, L - cost, W, B - cost, now + W, now + W
      end
      return (refund or cost <= L) and 1 or 0, L, W
    end
    local reset = e - now
    local shift = L - B
    local have = r + shift
    if refund then
      local left = min(have + cost, L)
      local v = left - shift
      if v == r then return 1, max(left, 0), reset end
      if undo and left >= L then return 1, max(left, 0), reset, v, now, w end
      return 1, max(left, 0), reset, v, e, w
    end
    if cost == 0 then return (have > 0) and 1 or 0, max(have, 0), reset end
    if have >= cost then
      -- (Beyond 2^53 the subtraction can round back to the value stored:
      -- nothing is written then.)
      local v = have - cost - shift
      if v == r then return 1, have - cost, reset end
      return 1, have - cost, reset, v, e, w
    end
    return 0, max(have, 0), reset
  end

  -- Lone ops (no refunds) on keys i..last, one shape, straight on Redis,
  -- for the lean path; answers into out from out[j + 1]; returns the new j.
  -- PTTL, then DECRBY before deciding, given back with INCRBY when denied:
  -- each Redis command or Lua function call costs a counter thousands of
  -- instructions, more than the give-back, so the common case (a counter
  -- with a TTL, allowed) is A.step's allowed branch inline, on the value
  -- DECRBY left; the rest (denied, no TTL, a check, a value Redis cannot
  -- count) goes through read, step and save. `ct`: the cost as text.
  local type = type
  function A.run(i, last, L, W, B, cost, ct, out, j)
    local shift, charge = L - B, cost > 0
    -- The common case: DECRBY answered d with -shift <= d < hi (none when
    -- shift or cost reach 2e15): below 2e15 each, every sum stays exact.
    local hi = (shift < 2e15 and shift > -2e15 and cost < 2e15) and 2e15 or -1 / 0
    for i = i, last do
      local k = KEYS[i]
      local ttl = rcall('PTTL', k)
      local d = ttl > 0 and charge and rpcall('DECRBY', k, ct)
      if d and type(d) == 'number' and d < hi and d >= -shift then
        -- (r = d + cost, have = r + shift: allowed, have >= cost)
        out[j + 1], out[j + 2] = d + shift, ttl
      else
        local a, left, t
        if d and type(d) == 'number' then
          if d + cost < 9e15 and d + cost > -9e15 then
            local e, v = now + ttl, nil
            a, left, t, v = A.step(d + cost, e, e, L, W, B, cost, false)
            if a ~= 1 or v == nil then
              rcall('INCRBY', k, ct)
            elseif v ~= d then
              A.save(k, v, e, nil, L, W, d, nil, e)
            end
          else
            rcall('INCRBY', k, ct)
          end
        end
        if not a then
          local r, e, w
          if ttl ~= -2 then r, e, w = A.read(k, rpcall('GET', k), W) end
          local n1, n2
          a, left, t, n1, n2 = A.step(r, e, w, L, W, B, cost, false)
          if a == 1 and n1 ~= nil then A.save(k, n1, n2, nil, L, W, r, nil, w) end
        end
        out[j + 1], out[j + 2] = (a == 1) and left or -1 - left, t
      end
      j = j + 2
    end
    return j
  end

  -- What the counter shows uncharged: credits left, ms to reset.
  function A.view(r, e, w, L, W, B)
    local _, left, t = A.step(r, e, w, L, W, B, 0, false)
    return left, t
  end

  -- Writes state r, e over what was read (r0, w0 from `read`; r0 nothing:
  -- no counter): DECRBY where the key keeps its expiry, else SET ... PX.
  function A.save(k, r, e, _, L, W, r0, _, w0)
    if e <= now then
      put(k, '', 0)
    elseif r0 and w0 == e then
      if r0 ~= r then
        local done = rpcall('DECRBY', k, texts[r0 - r])
        -- A value that is a number to Lua but not an integer to Redis (an
        -- error table, never equal to a number), or a count Lua rounded,
        -- is rewritten whole.
        if done ~= r then put(k, fmt(r), e - now) end
      end
    else
      put(k, fmt(r), e - now)
    end
  end
  return A
end
