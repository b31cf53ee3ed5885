-- Sluice: one token-bucket decision, atomically. The transition is
-- bucket.Plan at a tick of 1 microsecond (docs/internals.md); this script
-- must reproduce it bit for bit. docs/redis.md explains the layout.
--
-- KEYS[1]  the bucket
-- KEYS[2]  the request-ID record ("take" or "refund" with a request ID
--          only); same slot
--          For "takes": KEYS[i] is the bucket of the i-th take (a key may
--          repeat). For "all", "deny" and "giveback": KEYS[i] is the
--          bucket of the i-th part, 1 to 16 distinct buckets.
-- ARGV[1]  operation:
--            "take"      take the cost if the level covers it
--            "takes"     several takes without request IDs under one limit
--                        at one time
--            "peek"      what a take would decide; reads only, writes
--                        nothing
--            "all"       a multi-take: each part's cost from its bucket if
--                        every bucket covers its own, from none otherwise
--            "alls"      several multi-takes under the same specs at one
--                        time, decided one after another as separate calls
--                        back to back would be
--            "deny"      a multi-take's parts decided, nothing taken (the
--                        parts in the Cluster slots after the one that
--                        denied)
--            "giveback"  each part's cost given back to its bucket, never
--                        above capacity (what the earlier slots of a
--                        denied multi-take took); a missing bucket stays
--                        missing
--            "drain"     take the smaller of the cost and the whole tokens
--            "refund"    give the cost back, never above capacity; a
--                        missing bucket stays missing; with KEYS[2], undo
--                        the remembered take of the request ID, once
--            "reset"     make the bucket full under its own limit
-- ARGV[2]  now: "redis" (read Redis TIME) or microseconds since 2020-01-01Z
-- ARGV[3]  the spec: the limit and the store's settings, 38 bytes,
--          struct.pack(SPEC, C, n, P, n', p', conv, ttl):
--            C       capacity                        [1, 2^40]
--            n       rate tokens                     [0, 2^40]
--            P       rate period, microseconds       [1, 366 days]
--            n'      n / gcd(n, P)                   (0 when n = 0)
--            p'      P / gcd(n, P)                   (1 when n = 0), C * p' < 2^52
--            conv    on a limit change: 0 keep, 1 scale, 2 reset
--            ttl     least TTL of a written key, ms  [0, 2^53)
--          For "reset": the least TTL of the written key, ms [0, 2^53), as
--          a decimal integer, and no ARGV[4].
-- ARGV[4]  cost                                    [1, C]
--          ("drain": the caller's cost clamped to C, which the store
--          reports as never allowed when it was larger)
-- ARGV[5]  "take" or "refund" with KEYS[2] only: request-ID memory,
--          microseconds [1, 2^53)
--          For "takes": ARGV[3 + i] is the cost of the i-th take, each
--          [1, C], one per key. The takes are decided one after another at
--          the same time, as separate calls back to back would be; each
--          bucket is read once and written once, and the reply holds one
--          decision per take.
--          For "all", "deny" and "giveback": ARGV[1 + 2i] is the spec and
--          ARGV[2 + 2i] the cost of the i-th part (so ARGV[3] and ARGV[4]
--          are the first part's), each part under a limit of its own.
--          For "alls" of m multi-takes of k parts: KEYS[k(q - 1) + i] is
--          the bucket of part i of the q-th, ARGV[2 + i] the spec of part i
--          (the same for all), ARGV[2 + k + k(q - 1) + i] its cost.
--
-- Numbers are Lua doubles, exact only below 2^53. The spec's numbers are
-- integers by their encoding and must be in range; every text argument
-- must be a canonical decimal integer in its range; every stored number
-- must be in its range; or the script raises an error. Every number the
-- script uses is an integer below 2^53, so exact (the bound is noted beside
-- each step); the products that may exceed it (C * p' of a value not yet
-- checked, the refill's elapsed units) are only compared with a bound
-- below 2^53, and rounding is monotonic, so the comparison is exact. All
-- checks and arithmetic come before the first write, so a call that fails
-- writes nothing.
--
-- Lua computes a % b as a - floor(a/b)*b. For integers 0 <= a < 2^53 and
-- b >= 1 that is exact: a/b is rounded by at most a/b * 2^-53, which is
-- less than 1/b, while a quotient that is not a whole number lies at least
-- 1/b from one, so floor(a/b) is the true quotient q, and a - q*b is exact.
-- a - a % b is then a multiple of b, and dividing it by b is exact too.
--
-- Waits count from now, as bucket.Plan's do. A bucket is refilled only
-- from its stamp, which stays put when now is before it (a clock that
-- stepped back), so a wait is the time from the stamp until the level
-- covers the cost (or the capacity), plus ahead = stamp - now; a zero wait
-- stays zero and never stays never. The wait from the stamp is below
-- C * p' < 2^52 and ahead below 2^53 (both times are), so the sum is below
-- 1.5 * 2^53: exact while below 2^53, and sent as its decimal digits,
-- computed in two parts, when not (a clock more than 142 years behind a
-- stamp). Only the general path meets a stamp after now.
--
-- A denial on Redis TIME of a bucket stored under the same spec writes
-- nothing (see the fast path below); every other decision but "peek" writes
-- each bucket it read. Only an allowed take with a request ID writes its
-- record: a denial took nothing, so its retry decides afresh.
--
-- Bucket value:  the spec it was written under, then 20 bytes,
--                struct.pack('<I6I7I7', tokens, frac, stamp): the level
--                tokens + frac/p', brought up to date at microsecond
--                stamp. So one string comparison tells whether the
--                request's spec is the stored one, which the call that
--                wrote it checked in full, and one struct.unpack reads every
--                number; text would cost a pattern match and a conversion
--                per number, more than the rest of a decision.
-- Record value:  "at cost C n P allowed remaining retry reset", waits in
--                microseconds or "n" (never), then " r" once a refund has
--                undone the take.
-- Reply:         {kind, allowed (0|1), remaining, retry, reset} per cost
--                or part, with kind "ok", "conv" (the call converted a
--                bucket stored under another limit, which the store
--                counts) or "replay", and the waits in microseconds, -1 for
--                never, as integers (as text from 2^53 on); for a part,
--                allowed says whether its bucket covered its cost; or
--                {"conflict", cost, C, n, P} of the request ID's first use.
--                "drain" and "refund" add a sixth value: the tokens taken
--                or given back. "refund" of a request ID that is not
--                remembered replies {"unknown"}. "reset" replies {1}, or
--                {0} if the bucket was missing.
--                In a "takes" reply the takes of a bucket whose value
--                Sluice did not write are {"foreign", message, 0, 0, 0},
--                and the other takes are decided; in an "alls" reply so is
--                every part of a multi-take with such a bucket.
--
-- Every EVALSHA call runs this whole chunk afresh: each local function is
-- created anew on every call, and each function call, like each operation
-- of Lua's virtual machine, costs tens of machine instructions. So the
-- common decision, one take or peek of a bucket stored under the request's
-- spec or missing, runs first, straight through, with the arithmetic
-- written out in place, and so, after it, does a multi-take ("all") of such
-- buckets; the general path after them (request IDs, several takes, a
-- bucket converted to a new limit or stamped after now, the other
-- operations, and every error message) creates its functions only when it
-- runs. The paths compute the same transition, and the tests hold each to
-- bucket.Plan.

-- Little-endian unsigned integers of 6, 7 and 1 bytes: C, n, n' <= 2^40,
-- P, p' < 2^45 and tokens <= C fit 6; frac < 2^52 and stamp, ttl < 2^53
-- fit 7.
local SPEC, BUCKET = '<I6I6I6I6I6BI7', '<I6I6I6I6I6BI7I6I7I7'

-- The arguments' shape. "take" and "peek" of one bucket are the common
-- case; any other shape is checked in full.
local argv = ARGV
local op, nargs, nkeys = argv[1], #argv, #KEYS
local single = nkeys == 1 and nargs == 4 and (op == 'take' or op == 'peek')
local withID = false
if not single then
  withID = (op == 'take' or op == 'refund') and nkeys == 2 and nargs == 5
  local parts = op == 'all' or op == 'deny' or op == 'giveback'
  local k = nargs - 2 - nkeys -- "alls": the parts of each multi-take
  if not (withID or op == 'takes' and nkeys >= 1 and nargs == 3 + nkeys or
      parts and nkeys >= 1 and nkeys <= 16 and nargs == 2 + 2 * nkeys or
      op == 'alls' and nkeys >= 1 and k >= 1 and k <= 16 and nkeys % k == 0 or
      (op == 'drain' or op == 'refund') and nkeys == 1 and nargs == 4 or
      op == 'reset' and nkeys == 1 and nargs == 3) then
    if not (parts or op == 'take' or op == 'takes' or op == 'peek' or op == 'alls' or op == 'drain' or op == 'refund' or op == 'reset') then
      error({err = 'ERR sluice: operation ' .. string.format('%q', tostring(op)) ..
        ' is not "take", "takes", "peek", "all", "alls", "deny", "giveback", "drain", "refund" or "reset"'})
    end
    error({err = 'ERR sluice: ' .. nkeys .. ' keys and ' .. nargs .. ' arguments for "' .. op ..
      '"; want 1 key and 4 (take, peek, drain, refund), 2 keys and 5 (take or refund with a request ID), ' ..
      'one key per cost and 3 more (takes), 1 to 16 keys and 2 more per key plus 2 (all, deny, giveback), ' ..
      'k parts of m multi-takes: k times m keys, k specs, k times m costs and 2 more (alls), ' ..
      'or 1 key and 3 (reset)'})
  end
end

-- The time in microseconds since 2020-01-01T00:00:00Z (1577836800000000
-- microseconds after 1970), below 2^53 (9007199254740992).
local now = argv[2]
local redisTime = now == 'redis'
if redisTime then
  local tm = redis.call('TIME') -- two decimal integers
  now = tm[1] * 1000000 + tm[2] - 1577836800000000
  if not (now >= 0 and now < 9007199254740992) then
    error({err = 'ERR sluice: the Redis clock (' .. tm[1] .. ' s) is outside 2020 to 2305'})
  end
elseif (now == '0' or string.find(now, '^[1-9]%d*$')) and now + 0 < 9007199254740992 then
  now = now + 0
else
  now = nil -- refused on the general path, which names the fault
end

-- "reset" takes no spec: the bucket becomes full under the limit it is
-- stored under, stamped at now or at its stamp if that is later (time
-- never runs backwards inside a bucket), and expires as a full bucket
-- does, 1 ms after its stamp (ceil((stamp - now) / 1000) + 1 ms) but not
-- before the least TTL. A bucket that is full at now, as a missing one is,
-- is left as it is; request-ID records are kept. Its numbers are checked
-- as the general path's level() checks them, before the write, and the
-- refill to now is compared as there (the deficit is below 2^52, so the
-- comparison is exact).
if op == 'reset' then
  local least = argv[3]
  if not now then
    error({err = 'ERR sluice: time ' .. string.format('%q', string.sub(argv[2], 1, 24)) .. ' is not a decimal integer in [0, 2^53)'})
  end
  if not ((least == '0' or string.find(least, '^[1-9]%d*$')) and least + 0 < 9007199254740992) then
    error({err = 'ERR sluice: least TTL ' .. string.format('%q', string.sub(least, 1, 24)) .. ' is not a decimal integer in [0, 2^53)'})
  end
  least = least + 0
  local v = redis.pcall('GET', KEYS[1])
  if not v then
    return {0}
  end
  if type(v) ~= 'string' or #v ~= 58 then
    error({err = 'ERR sluice: bucket key holds a value sluice did not write' .. (type(v) == 'table' and ': ' .. tostring(v.err) or '')})
  end
  local c, _, _, a, b, _, ttl, t, f, s = struct.unpack(BUCKET, v)
  if not (c >= 1 and c <= 1099511627776 and a <= 1099511627776 and b >= 1 and c * b < 4503599627370496 and
      ttl < 9007199254740992 and t <= c and f < b and (t < c or f == 0) and s < 9007199254740992) then
    error({err = 'ERR sluice: bucket key holds a state sluice did not write'})
  end
  if t >= c or now > s and (now - s) * a >= (c - t) * b - f then
    return {0}
  end
  if s < now then s = now end
  local ahead = s - now
  local a = ahead % 1000
  ttl = (ahead - a) / 1000 + 1
  if a > 0 then ttl = ttl + 1 end
  if ttl < least then ttl = least end
  redis.call('SET', KEYS[1], string.sub(v, 1, 38) .. struct.pack('<I6I7I7', c, 0, s), 'PX', string.format('%d', ttl))
  return {1}
end

-- The spec, and the first bucket. A bucket stored under the request's spec
-- (the same bytes) carries it, checked by the call that wrote it, so the
-- numbers are read from the bucket and a take or peek of it does not check
-- the spec again (only the ranges exactness needs, below). Every other call
-- checks the spec in full; specOK tells whether it passed, and the general
-- path names the fault if not.
local spec = argv[3]
if #spec ~= 38 then
  error({err = 'ERR sluice: spec of ' .. #spec .. ' bytes, want 38'})
end
-- A value of another type under the key is an error table, which no
-- path but the general one takes, and which it reports.
local first = redis.pcall('GET', KEYS[1])
local same = first and #first == 58 and string.find(first, spec, 1, true) == 1
local C, n, P, n1, p1, conv, least, tokens, frac, stamp =
  struct.unpack(same and BUCKET or SPEC, same and first or spec)
-- specValid reports whether a spec's numbers are in range for exact
-- arithmetic. Ranges: C in [1, 2^40], n in [0, 2^40], P in [1, 366 days],
-- least TTL below 2^53; C * p' < 2^52 (rounding is monotonic, so the
-- comparison is exact). The reduced rate must be n/P in lowest terms,
-- since the fraction units of a stored bucket are counted on that grid:
-- x % y == 0 is exact (see above), and so is Euclid's algorithm.
local function specValid(C, n, P, n1, p1, conv, least)
  if not (C >= 1 and C <= 1099511627776 and n <= 1099511627776 and P >= 1 and P <= 31622400000000 and
      n1 <= n and p1 >= 1 and p1 <= P and conv <= 2 and least < 9007199254740992 and
      C * p1 < 4503599627370496) then
    return false
  end
  if n == 0 then
    return n1 == 0 and p1 == 1
  end
  if not (n1 > 0 and P % p1 == 0 and n % n1 == 0 and P / p1 == n / n1) then
    return false
  end
  local x, y = n1, p1
  while y > 0 do
    x, y = y, x % y
  end
  return x == 1
end
local specOK = same and op ~= 'takes'
if not specOK then
  specOK = specValid(C, n, P, n1, p1, conv, least)
end
if not same then
  -- A missing bucket is full, stamped now.
  tokens, frac, stamp = C, 0, now
end

-- The fast path: one take without a request ID, or a peek, for a cost in
-- range, of a missing bucket or of one stored under the spec whose numbers
-- are in range (C <= 2^40, n' <= 2^40, C * p' < 2^52, least TTL < 2^53,
-- tokens <= C, frac < p' and zero at C; C >= 1 and p' >= 1 follow from
-- 1 <= cost <= C and 0 <= frac < p') and whose stamp is not after now.
-- Anything else takes the general path, which names any fault.
if now and single and specOK and (not first or same and
    C <= 1099511627776 and n1 <= 1099511627776 and C * p1 < 4503599627370496 and least < 9007199254740992 and
    tokens <= C and frac < p1 and (tokens < C or frac == 0) and stamp <= now) then
  local cost = argv[4]
  if cost == '1' then
    cost = 1
  elseif string.find(cost, '^[1-9]%d*$') then
    cost = cost + 0
  else
    cost = 0
  end
  if cost >= 1 and cost <= C then
    -- The refill is bucket.Plan.Refill: (now - stamp) * n' units, capped
    -- at full, which D = (C - tokens) * p' - frac < C * p' < 2^52 units
    -- away. The product may be inexact only at 2^52 or more, above D, so
    -- the comparison is exact, and below D so is the sum.
    if now > stamp then
      local d, u = (C - tokens) * p1 - frac, (now - stamp) * n1
      if u >= d then
        tokens, frac = C, 0
      else
        u = u + frac
        frac = u % p1
        tokens = tokens + (u - frac) / p1
      end
    end
    -- The waits, rounded up, until cost tokens and until full, at n' units
    -- a microsecond, -1 if never (n' = 0): ceil(x / n') for x >= 1 units is
    -- floor((x - 1) / n') + 1, and x < C * p' < 2^52.
    local allowed, retry, reset = tokens >= cost, 0, -1
    if allowed then
      if op == 'take' then tokens = tokens - cost end
    elseif n1 > 0 then
      local x = (cost - tokens) * p1 - frac - 1
      retry = (x - x % n1) / n1 + 1
    else
      retry = -1
    end
    if tokens >= C then
      reset = 0
    elseif n1 > 0 then
      local x = (C - tokens) * p1 - frac - 1
      reset = (x - x % n1) / n1 + 1
    end
    -- The bucket expires 1 ms after it is full again, ceil(reset / 1000) +
    -- 1 ms (the extra ms covers a server whose expiry clock was read before
    -- TIME), but not before the spec's least TTL, and never if it never
    -- refills. A denial on Redis TIME of a bucket stored under the spec
    -- writes nothing: it leaves the level below C, so refilling the stored
    -- state straight to a later time gives exactly what refilling it to now
    -- and on from there would (whole units add up, no cap falls between),
    -- and the stored TTL already ends when it is full. With an explicit
    -- time, which a caller may pass out of order, a denial writes its
    -- stamp, which must then hold.
    if op == 'take' and (allowed or not (same and redisTime)) then
      local value = spec .. struct.pack('<I6I7I7', tokens, frac, now)
      if reset < 0 then
        redis.call('SET', KEYS[1], value)
      else
        local x = reset + 999
        local ttl = (x - x % 1000) / 1000 + 1
        if ttl < least then ttl = least end
        redis.call('SET', KEYS[1], value, 'PX', string.format('%d', ttl))
      end
    end
    return {'ok', allowed and 1 or 0, tokens, retry, reset}
  end
end

-- The fast path of a multi-take ("all"): every bucket missing or stored
-- under its part's spec with its stamp not after now, every spec and cost
-- in range. It runs straight through as the single take's does, with its
-- checks, refill, waits and expiry, and creates no function; anything else
-- (a conversion, a stamp after now, a bucket twice, a fault) takes the
-- general path, which decides the same or names the fault. The first
-- part's numbers were read above, the others' here: Cs, N1, P1, LT hold
-- each part's capacity, n', p' and least TTL, T, F its level, CO its cost,
-- SM whether it is stored under its spec.
if now and op == 'all' and specOK and (not first or same and
    C <= 1099511627776 and n1 <= 1099511627776 and C * p1 < 4503599627370496 and least < 9007199254740992 and
    tokens <= C and frac < p1 and (tokens < C or frac == 0) and stamp <= now) then
  local Cs, N1, P1, LT, T, F, CO, SM = {C}, {n1}, {p1}, {least}, {tokens}, {frac}, {}, {same}
  local ok, seen = true, {[KEYS[1]] = true}
  for i = 2, nkeys do
    local key, sp = KEYS[i], argv[1 + 2 * i]
    if seen[key] or #sp ~= 38 then
      ok = false
      break
    end
    seen[key] = true
    local v = redis.pcall('GET', key)
    local c, a, p, a1, b1, cv, lt, t, f, st
    if not v then
      -- The spec in full, as the first part's above.
      c, a, p, a1, b1, cv, lt = struct.unpack(SPEC, sp)
      if not specValid(c, a, p, a1, b1, cv, lt) then
        ok = false
        break
      end
      t, f = c, 0
      SM[i] = false
    elseif type(v) == 'string' and #v == 58 and string.find(v, sp, 1, true) == 1 then
      c, a, p, a1, b1, cv, lt, t, f, st = struct.unpack(BUCKET, v)
      if not (c >= 1 and c <= 1099511627776 and a1 <= 1099511627776 and b1 >= 1 and c * b1 < 4503599627370496 and
          lt < 9007199254740992 and t <= c and f < b1 and (t < c or f == 0) and st <= now) then
        ok = false
        break
      end
      -- The refill, as the single take's.
      if now > st then
        local d, u = (c - t) * b1 - f, (now - st) * a1
        if u >= d then
          t, f = c, 0
        else
          u = u + f
          f = u % b1
          t = t + (u - f) / b1
        end
      end
      SM[i] = true
    else
      ok = false
      break
    end
    Cs[i], N1[i], P1[i], LT[i], T[i], F[i] = c, a1, b1, lt, t, f
  end
  if ok and same and now > stamp then
    local d, u = (C - tokens) * p1 - frac, (now - stamp) * n1
    if u >= d then
      T[1], F[1] = C, 0
    else
      u = u + frac
      F[1] = u % p1
      T[1] = tokens + (u - F[1]) / p1
    end
  end
  local all = ok
  for i = 1, ok and nkeys or 0 do
    local cost = argv[2 + 2 * i]
    if cost == '1' then
      cost = 1
    elseif string.find(cost, '^[1-9]%d*$') then
      cost = cost + 0
    else
      cost = 0
    end
    if not (cost >= 1 and cost <= Cs[i]) then
      ok = false
      break
    end
    CO[i] = cost
    all = all and T[i] >= cost
  end
  if ok then
    local reply = {}
    for i = 1, nkeys do
      local c, a1, b1, t, f, cost = Cs[i], N1[i], P1[i], T[i], F[i], CO[i]
      local covers, retry, reset = t >= cost, 0, -1
      if all then
        t = t - cost
      elseif not covers and a1 > 0 then
        local x = (cost - t) * b1 - f - 1
        retry = (x - x % a1) / a1 + 1
      elseif not covers then
        retry = -1
      end
      if t >= c then
        reset = 0
      elseif a1 > 0 then
        local x = (c - t) * b1 - f - 1
        reset = (x - x % a1) / a1 + 1
      end
      local r = 5 * (i - 1)
      reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4], reply[r + 5] = 'ok', covers and 1 or 0, t, retry, reset
      -- Written as the single take writes: not a denial on Redis TIME of
      -- a bucket stored under its spec.
      if all or not (redisTime and SM[i]) then
        local value = argv[1 + 2 * i] .. struct.pack('<I6I7I7', t, f, now)
        if reset < 0 then
          redis.call('SET', KEYS[i], value)
        else
          local x = reset + 999
          local ttl = (x - x % 1000) / 1000 + 1
          if ttl < LT[i] then ttl = LT[i] end
          redis.call('SET', KEYS[i], value, 'PX', string.format('%d', ttl))
        end
      end
    end
    return reply
  end
end

-- The general path: a request ID, several takes, a bucket stored under
-- another spec (converted) or with a stamp after now, every operation but
-- "take", "peek" and "reset", or a fault to report.

local TWO52 = 4503599627370496
local TWO53 = 9007199254740992
local MAX_CAPACITY = 1099511627776 -- 2^40, sluice.MaxCapacity
local MAX_TOKENS = 1099511627776   -- 2^40, sluice.MaxTokens
local MAX_PERIOD = 31622400000000  -- 366 days in microseconds, sluice.MaxPeriod
local format = string.format

local function fail(msg)
  error({err = 'ERR sluice: ' .. msg})
end

-- int parses s, which must be a canonical decimal integer (digits only, no
-- leading zero) in [lo, hi], hi < 2^53. This refuses "nan", "inf", "1e309",
-- "0x10", "-0", " 12 ", "" and 9007199254740993: digits alone leave tonumber
-- no other reading, and a number of 2^53 or more rounds to 2^53 or more, so
-- the range check refuses it.
local function int(what, s, lo, hi)
  if not (s == '0' or string.find(s, '^[1-9]%d*$')) then
    if #s > 24 then s = s:sub(1, 24) .. '...' end
    fail(format('%s %q is not a decimal integer', what, s))
  end
  local x = s + 0
  if x < lo or x > hi then
    fail(format('%s %s is outside [%d, %d]', what, s, lo, hi))
  end
  return x
end

if not now then
  now = int('time', argv[2], 0, TWO53 - 1)
end

-- checkSpec fails, naming the fault, unless the spec C, n, P, n', p',
-- conv, least TTL is in range and its rate reduced to lowest terms, as the
-- first spec was checked above (which part names the spec, '' for the
-- first).
local function checkSpec(which)
  local function within(what, x, lo, hi)
    if x < lo or x > hi then
      fail(format('%s%s %d is outside [%d, %d]', which, what, x, lo, hi))
    end
  end
  within('capacity', C, 1, MAX_CAPACITY)
  within('rate tokens', n, 0, MAX_TOKENS)
  within('rate period', P, 1, MAX_PERIOD)
  within('reduced rate tokens', n1, 0, n)
  within('reduced rate period', p1, 1, P)
  within('limit-change conversion', conv, 0, 2)
  within('least TTL', least, 0, TWO53 - 1)
  if C * p1 >= TWO52 then
    fail(format('%scapacity %d times reduced period %d is 2^52 or more: Redis cannot decide this limit exactly', which, C, p1))
  end
  local ok
  if n == 0 then
    ok = n1 == 0 and p1 == 1
  else
    ok = n1 > 0 and P % p1 == 0 and n % n1 == 0 and P / p1 == n / n1
    local x, y = n1, p1
    while y > 0 do
      x, y = y, x % y
    end
    ok = ok and x == 1
  end
  if not ok then
    fail(format('%sreduced rate %d/%d is not %d/%d in lowest terms', which, n1, p1, n, P))
  end
end

if not specOK then
  checkSpec('')
  fail(format('reduced rate %d/%d is not %d/%d in lowest terms', n1, p1, n, P))
end

-- level takes the numbers of a bucket value, as struct.unpack(BUCKET)
-- returns them, checks them, and returns the level tokens + frac/p'
-- brought up to date at now and its stamp (time never runs backwards inside
-- a bucket), then the limit (C, n', p', n, P). The numbers are integers by
-- their encoding and checked in range here, so that not even a foreign
-- value makes an intermediate inexact. The refill is the fast path's.
local function level(c, n0, P0, a, b, _, ttl, t, f, s)
  if not (c >= 1 and c <= MAX_CAPACITY and a <= MAX_TOKENS and b >= 1 and c * b < TWO52 and
      ttl < TWO53 and t <= c and f < b and (t < c or f == 0) and s < TWO53) then
    fail('bucket key holds a state sluice did not write')
  end
  if now > s then
    local d, u = (c - t) * b - f, (now - s) * a
    if u >= d then
      t, f = c, 0
    else
      u = u + f
      f = u % b
      t = t + (u - f) / b
    end
    s = now
  end
  return t, f, s, c, a, b, n0, P0
end

-- wait returns the microseconds, rounded up, from the stamp until the
-- level tokens + frac/p' reaches target at n' units a microsecond: 0 if it
-- has, -1 if it never does (n' = 0); as on the fast path. Below 2^52.
local function wait(t, f, target)
  if t >= target then return 0 end
  if n1 == 0 then return -1 end
  local x = (target - t) * p1 - f - 1
  return (x - x % n1) / n1 + 1
end

-- fromNow returns the wait w, measured from a stamp ahead microseconds
-- after now, measured from now: w + ahead, unless w is 0 or -1 (never).
-- w < 2^52 and ahead < 2^53, so a sum of 2^53 or more, which a double may
-- not hold, is made of both terms split at 10^8 and returned as decimal
-- text.
local function fromNow(w, ahead)
  if w <= 0 or ahead == 0 then return w end
  local sum = w + ahead
  if sum < TWO53 then return sum end
  local wl, al = w % 100000000, ahead % 100000000
  local hi, lo = (w - wl) / 100000000 + (ahead - al) / 100000000, wl + al
  if lo >= 100000000 then hi, lo = hi + 1, lo - 100000000 end
  return format('%d%08d', hi, lo)
end

-- muldiv returns floor(x*y/z) exactly for integers 0 <= x < z < 2^52 and
-- 0 <= y < 2^53, by binary long multiplication: y's bits are taken from the
-- top, keeping q*z + r = x * (the bits taken) with r < z, so that 2r and
-- r + x stay below 2z < 2^53 and q below y.
local function muldiv(x, y, z)
  local bit = 1
  while bit * 2 <= y do bit = bit * 2 end
  local q, r = 0, 0
  while bit >= 1 do
    q, r = q * 2, r * 2
    if r >= z then q, r = q + 1, r - z end
    if y >= bit then
      y = y - bit
      r = r + x
      if r >= z then q, r = q + 1, r - z end
    end
    bit = bit / 2
  end
  return q
end

-- load returns the bucket value stored (a string, false if missing, or
-- the error table of a GET of another type) brought up to date: a missing
-- one is full, stamped now; one stored under another limit is converted to
-- the request's (one under the request's spec has its limit), and load then
-- also returns true.
local function load(stored)
  if not stored then
    return C, 0, now, false
  end
  if type(stored) == 'table' then
    fail('bucket key holds a value sluice did not write: ' .. tostring(stored.err))
  end
  if #stored ~= 58 then
    fail('bucket key holds a value sluice did not write')
  end
  local t0, f0, stamp, C0, a0, b0, n0, P0 = level(struct.unpack(BUCKET, stored))
  if C0 == C and n0 == n and P0 == P then
    if a0 ~= n1 or b0 ~= p1 then
      fail('bucket key holds a rate reduced otherwise')
    end
    return t0, f0, stamp, false
  end
  -- Another limit: refilled under the old one by level, then converted,
  -- rounding down; a bucket full under the old limit is full under the new.
  local t, f
  if t0 >= C0 or conv == 2 then
    t, f = C, 0
  elseif conv == 1 then
    -- floor(U * C*p' / (C0*b0)) units of 1/p' with U = t0*b0 + f0 <
    -- C0*b0 < 2^52, and below C*p' < 2^52.
    local u = muldiv(t0 * b0 + f0, C * p1, C0 * b0)
    f = u % p1
    t = (u - f) / p1
  elseif t0 >= C then
    t, f = C, 0
  else
    t, f = t0, muldiv(f0, p1, b0) -- f0 < b0 < 2^52, p1 < 2^52
  end
  if t >= C then
    t, f = C, 0
  end
  return t, f, stamp, true
end

-- put writes the bucket at key: the spec sp it is decided under, then the
-- level t + f/p' at stamp s. It expires as on the fast path, measured from
-- its stamp, which may be after now: ceil((s - now + reset) / 1000) + 1 ms,
-- each term divided alone, since the sum may reach 2^53, but not before the
-- least TTL lt; never if reset is -1 (it never refills).
local function put(key, sp, lt, t, f, s, reset)
  local value = sp .. struct.pack('<I6I7I7', t, f, s)
  if reset < 0 then
    redis.call('SET', key, value)
    return
  end
  local ahead = s - now
  local a, b = ahead % 1000, reset % 1000
  local ttl = (ahead - a) / 1000 + (reset - b) / 1000 + 1
  if a + b > 0 then ttl = ttl + 1 end
  if a + b > 1000 then ttl = ttl + 1 end
  if ttl < lt then ttl = lt end
  redis.call('SET', key, value, 'PX', format('%d', ttl))
end

-- "alls": m multi-takes of k parts under the same k specs, decided one
-- after another at one time, as separate "all" calls back to back would
-- be: each bucket is read once, continues from the level the multi-takes
-- before left, and is written once at the end, if a multi-take that was
-- decided met it and it must be written (not a denial on Redis TIME of a
-- bucket stored under its spec). A bucket is always one part's (the Go
-- side groups only multi-takes that agree); a multi-take with a bucket
-- whose value Sluice did not write gets "foreign" for its parts, changes
-- nothing, and the others are decided.
if op == 'alls' then
  local k = nargs - 2 - nkeys
  local SP, CC, NN, PP, A1, B1, CN, LT = {}, {}, {}, {}, {}, {}, {}, {}
  for i = 1, k do
    local sp = argv[2 + i]
    if i > 1 then
      if #sp ~= 38 then
        fail(format('part %d: spec of %d bytes, want 38', i, #sp))
      end
      C, n, P, n1, p1, conv, least = struct.unpack(SPEC, sp)
      checkSpec(format('part %d: ', i))
    end
    SP[i], CC[i], NN[i], PP[i], A1[i], B1[i], CN[i], LT[i] = sp, C, n, P, n1, p1, conv, least
  end
  -- Every cost, before anything is decided.
  local CO = {}
  for x = 1, nkeys do
    CO[x] = int('cost', argv[2 + k + x], 1, CC[(x - 1) % k + 1])
  end
  local K, at, pos, T, F, S, CV, E, QW, USED, TOOK = {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}
  local reply = {}
  for base = 0, nkeys - k, k do
    local bad
    for i = 1, k do
      local key = KEYS[base + i]
      local j = at[key]
      if not j then
        j = #K + 1
        K[j], at[key], pos[j] = key, j, i
        C, n, P, n1, p1, conv, least = CC[i], NN[i], PP[i], A1[i], B1[i], CN[i], LT[i]
        local stored, sm = first, same
        if base + i > 1 then
          stored = redis.pcall('GET', key)
          sm = type(stored) == 'string' and #stored == 58 and string.find(stored, SP[i], 1, true) == 1
        end
        local ok, t, f, st, cv = pcall(load, stored)
        if ok then
          T[j], F[j], S[j], CV[j] = t, f, st, cv
        else
          E[j] = type(t) == 'table' and t.err or tostring(t)
        end
        QW[j] = not (redisTime and sm)
      elseif pos[j] ~= i then
        fail(format('bucket %d of a multi-take is part %d of another', i, pos[j]))
      end
      bad = bad or E[j]
    end
    if bad then
      for r = 5 * base, 5 * (base + k) - 1, 5 do
        reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4], reply[r + 5] = 'foreign', bad, 0, 0, 0
      end
    else
      local all = true
      for i = 1, k do
        if T[at[KEYS[base + i]]] < CO[base + i] then all = false end
      end
      for i = 1, k do
        local j, cost = at[KEYS[base + i]], CO[base + i]
        n1, p1 = A1[i], B1[i]
        local t, f = T[j], F[j]
        local covers, retry = t >= cost, 0
        if all then
          t = t - cost
          TOOK[j] = true
        elseif not covers then
          retry = wait(t, f, cost)
        end
        T[j], USED[j] = t, true
        local ahead, r = S[j] - now, 5 * (base + i - 1)
        reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4], reply[r + 5] =
          CV[j] and 'conv' or 'ok', covers and 1 or 0, t, fromNow(retry, ahead), fromNow(wait(t, f, CC[i]), ahead)
        CV[j] = false
      end
    end
  end
  for j = 1, #K do
    if USED[j] and (TOOK[j] or QW[j]) then
      local i = pos[j]
      n1, p1 = A1[i], B1[i]
      put(K[j], SP[i], LT[i], T[j], F[j], S[j], wait(T[j], F[j], CC[i]))
    end
  end
  return reply
end

-- The operations on parts, each under a spec of its own ("all", "deny",
-- "giveback"), and "drain" and "refund" of one bucket. Every part is read,
-- checked and brought up to date under its spec before anything is
-- decided or written: SP, CC, A1, B1 and LT hold its spec, capacity, n',
-- p' and least TTL, CO its cost, T, F, S its level and stamp, CV whether it
-- was converted, SM whether it is stored under its spec (a denial on Redis
-- TIME of such a bucket, or any call that takes and gives nothing, need
-- not write it: the argument of the fast path), EX whether it exists. The
-- spec variables C, n, P, n', p', conv, least, which load and wait read,
-- are set to each part's in turn.
if op ~= 'take' and op ~= 'takes' and op ~= 'peek' then
  local parts = nkeys
  if op == 'drain' or op == 'refund' then parts = 1 end
  local SP, CC, A1, B1, LT, CO, T, F, S, CV, SM, EX, seen = {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}
  for i = 1, parts do
    local sp, stored, sm = spec, first, same
    if seen[KEYS[i]] then
      fail(format('bucket %d is bucket %d again; a bucket appears once per call', i, seen[KEYS[i]]))
    end
    seen[KEYS[i]] = i
    if i > 1 then
      sp = argv[1 + 2 * i]
      if #sp ~= 38 then
        fail(format('bucket %d: spec of %d bytes, want 38', i, #sp))
      end
      stored = redis.pcall('GET', KEYS[i])
      sm = type(stored) == 'string' and #stored == 58 and string.find(stored, sp, 1, true) == 1
      C, n, P, n1, p1, conv, least = struct.unpack(SPEC, sp)
      -- A spec stored in the bucket was checked in full when written;
      -- level checks the numbers exactness needs.
      if not sm then
        checkSpec(format('bucket %d: ', i))
      end
    end
    SP[i], CC[i], A1[i], B1[i], LT[i], SM[i], EX[i] = sp, C, n1, p1, least, sm, type(stored) == 'string'
    CO[i] = int('cost', argv[2 + 2 * i], 1, C)
    T[i], F[i], S[i], CV[i] = load(stored)
  end

  if op == 'drain' or op == 'refund' then
    local t, f, s, cost = T[1], F[1], S[1], CO[1]
    local replay, moved, write = false, 0, false
    if op == 'drain' then
      moved = cost
      if t < cost then moved = t end
      t = t - moved
      write = moved > 0 or not (redisTime and SM[1])
    else
      if withID then
        -- The allowed take of the request ID, remembered while now is
        -- before its time plus the request-ID memory (or before its time:
        -- the clock stepped back), for at most its cost under its limit.
        local idTTL = int('request-ID memory', argv[5], 1, TWO53 - 1)
        local rec = redis.call('GET', KEYS[2])
        if rec then
          local refunded = string.sub(rec, -2) == ' r'
          if refunded then
            rec = string.sub(rec, 1, -3)
          end
          local at, rcost, rC, rn, rP = string.match(rec,
            '^(%d+) (%d+) (%d+) (%d+) (%d+) [01] %d+ [%dn]+ [%dn]+$')
          if not at then
            fail('request-ID key holds a value sluice did not write')
          end
          local at0 = int('stored time', at, 0, TWO53 - 1)
          local took = int('stored cost', rcost, 1, TWO53 - 1)
          if not (now < at0 or now - at0 < idTTL) then
            rec = false
          elseif not (rC == format('%d', C) and rn == format('%d', n) and rP == format('%d', P)) or cost > took then
            return {'conflict', rcost, rC, rn, rP}
          end
          replay = refunded
        end
        if not rec then
          return {'unknown'}
        end
      end
      -- A bucket full at now (a missing one is) is left as it is, its
      -- stamp included; any other is written, refilled and raised.
      if not replay then
        moved = C - t
        if cost < moved then moved = cost end
        t = t + moved
        if t == C then f = 0 end
        write = moved > 0
      end
    end
    -- A drain is allowed if all of its cost was there, and then waits for
    -- nothing; a refund always is.
    local allowed, retry = op == 'refund' or moved == cost, 0
    if not allowed then
      retry = wait(t, f, cost)
    end
    local reset, ahead = wait(t, f, C), s - now
    if write then
      put(KEYS[1], SP[1], LT[1], t, f, s, reset)
    end
    if withID and not replay then
      redis.call('APPEND', KEYS[2], ' r')
    end
    local kind = CV[1] and write and 'conv' or 'ok'
    if replay then kind = 'replay' end
    return {kind, allowed and 1 or 0, t, fromNow(retry, ahead), fromNow(reset, ahead), moved}
  end

  -- "all" takes every cost if every bucket covers its own; "deny" takes
  -- none; "giveback" adds each cost, never above capacity (a level that
  -- reaches it is exactly full).
  local all = op == 'all'
  for i = 1, parts do
    if T[i] < CO[i] then all = false end
  end
  local reply, W, R = {}, {}, {}
  for i = 1, parts do
    C, n1, p1 = CC[i], A1[i], B1[i]
    local t, f, cost = T[i], F[i], CO[i]
    local covers, retry = t >= cost, 0
    if op == 'giveback' then
      local added = C - t
      if cost < added then added = cost end
      t = t + added
      if t == C then f = 0 end
      covers = true
      W[i] = EX[i] and (added > 0 or not (redisTime and SM[i]))
    else
      if all then
        t = t - cost
      elseif not covers then
        retry = wait(t, f, cost)
      end
      W[i] = all or not (redisTime and SM[i])
    end
    T[i], F[i], R[i] = t, f, wait(t, f, C)
    local ahead, r = S[i] - now, 5 * (i - 1)
    reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4], reply[r + 5] =
      CV[i] and 'conv' or 'ok', covers and 1 or 0, t, fromNow(retry, ahead), fromNow(R[i], ahead)
  end
  for i = 1, parts do
    if W[i] then
      put(KEYS[i], SP[i], LT[i], T[i], F[i], S[i], R[i])
    end
  end
  return reply
end

-- The first bucket, if stored under the spec, is checked and brought up to
-- date before anything else: its numbers were unpacked above, before the
-- fast path. ("takes" checks each bucket apart, below.)
local T1, F1, S1
if same and op ~= 'takes' then
  T1, F1, S1 = level(C, n, P, n1, p1, conv, least, tokens, frac, stamp)
end

-- The cost, or the costs of "takes", each in [1, C].
local cost = int('cost', argv[4], 1, C)
local costs = {cost}
if op == 'takes' then
  for i = 5, nargs do
    costs[i - 3] = int('cost', argv[i], 1, C)
  end
end

-- A remembered request ID: the same decision again, or a conflict. Only
-- allowed decisions are remembered.
local idTTL
if withID then
  idTTL = int('request-ID memory', argv[5], 1, TWO53 - 1)
  local rec = redis.call('GET', KEYS[2])
  if rec then
    -- A refund of the take marked the record; its replay is the same.
    if string.sub(rec, -2) == ' r' then
      rec = string.sub(rec, 1, -3)
    end
    local at, rcost, rC, rn, rP, ok, rem, retry, reset = string.match(rec,
      '^(%d+) (%d+) (%d+) (%d+) (%d+) ([01]) (%d+) ([%dn]+) ([%dn]+)$')
    if not at then
      fail('request-ID key holds a value sluice did not write')
    end
    local at0 = int('stored time', at, 0, TWO53 - 1)
    if now < at0 or now - at0 < idTTL then
      if rcost == argv[4] and rC == format('%d', C) and rn == format('%d', n) and rP == format('%d', P) then
        if not (retry == 'n' or string.find(retry, '^%d+$')) or not (reset == 'n' or string.find(reset, '^%d+$')) then
          fail('request-ID key holds a value sluice did not write')
        end
        -- Waits of 2^53 or more stay text.
        local function w(x)
          if x == 'n' then return -1 end
          if #x < 16 then return x + 0 end
          return x
        end
        return {'replay', ok + 0, rem + 0, w(retry), w(reset)}
      end
      return {'conflict', rcost, rC, rn, rP}
    end
  end
end

-- Every bucket read and checked before the first write (K lists the keys
-- in the order first met, at[key] indexes their levels); a key met again
-- continues from the level the takes before left. W[j] says whether the
-- bucket must be written: not after a denial on Redis TIME of a bucket
-- stored under the spec, as on the fast path. CV[j] says whether it was
-- converted, which the first take of it reports. In "takes" a bucket whose
-- value load refuses gets E[j], the message, for each of its takes, and is
-- neither decided nor written; elsewhere the error ends the call.
local K, at, T, F, S, R, W, CV, E = {}, {}, {}, {}, {}, {}, {}, {}, {}
for i = 1, #costs do
  local key = KEYS[i]
  if not at[key] then
    local j = #K + 1
    local stored, sameJ = first, same
    if j > 1 then
      stored = redis.pcall('GET', key)
      sameJ = type(stored) == 'string' and #stored == 58 and string.find(stored, spec, 1, true) == 1
    end
    K[j], at[key] = key, j
    if j == 1 and same and op ~= 'takes' then
      T[j], F[j], S[j], CV[j] = T1, F1, S1, false
    elseif op == 'takes' then
      local ok, t, f, s, cv = pcall(load, stored)
      if ok then
        T[j], F[j], S[j], CV[j] = t, f, s, cv
      else
        E[j] = type(t) == 'table' and t.err or tostring(t)
      end
    else
      T[j], F[j], S[j], CV[j] = load(stored)
    end
    W[j] = not (redisTime and sameJ)
  end
end
local reply = {}
for i = 1, #costs do
  local j = at[KEYS[i]]
  local r = 5 * (i - 1)
  if E[j] then
    W[j] = false
    reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4], reply[r + 5] = 'foreign', E[j], 0, 0, 0
  else
    local t, f, c = T[j], F[j], costs[i]
    local allowed = t >= c
    if allowed and op ~= 'peek' then
      t = t - c
    end
    local retry = 0
    if not allowed then
      retry = wait(t, f, c)
    end
    T[j], R[j], W[j] = t, wait(t, f, C), W[j] or allowed
    local ahead = S[j] - now
    reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4], reply[r + 5] =
      CV[j] and 'conv' or 'ok', allowed and 1 or 0, t, fromNow(retry, ahead), fromNow(R[j], ahead)
    CV[j] = false
  end
end
if op == 'peek' then
  return reply
end
for j = 1, #K do
  if W[j] then
    put(K[j], spec, least, T[j], F[j], S[j], R[j])
  end
end
-- An allowed take with a request ID is remembered; a denial is not (it
-- took nothing, so its retry decides afresh). An allowed take waits for
-- nothing, and its wait until full, if text (2^53 or more), stays text.
if withID and reply[2] == 1 then
  local reset = reply[5]
  if type(reset) ~= 'string' then
    reset = reset >= 0 and format('%d', reset) or 'n'
  end
  local rec = format('%d %s %d %d %d 1 %d 0 %s', now, argv[4], C, n, P, reply[3], reset)
  local r = idTTL % 1000
  local ttl = (idTTL - r) / 1000 + 1
  if r > 0 then ttl = ttl + 1 end
  if ttl < least then ttl = least end
  redis.call('SET', KEYS[2], rec, 'PX', format('%d', ttl))
end
return reply
