-- Sluice: one token-bucket decision, atomically. The transition is
-- sluice.Plan at a tick of 1 microsecond (docs/internals.md); this script
-- must reproduce it bit for bit. docs/redis.md explains the layout.
--
-- KEYS[1]  the bucket
-- KEYS[2]  the request-ID record ("take" with a request ID only); same slot
--          For "takes": KEYS[i] is the bucket of the i-th take (a key may
--          repeat).
-- ARGV[1]  operation: "take", "takes" (several takes without request IDs
--          under one limit at one time), or "peek" (reads only, writes
--          nothing)
-- ARGV[2]  now: "redis" (read Redis TIME) or microseconds since 2020-01-01Z
-- ARGV[3]  the spec: the limit and the store's settings, 38 bytes,
--          struct.pack(SPEC, C, n, P, n', p', policy, ttl):
--            C       capacity                        [1, 2^40]
--            n       rate tokens                     [0, 2^40]
--            P       rate period, microseconds       [1, 366 days]
--            n'      n / gcd(n, P)                   (0 when n = 0)
--            p'      P / gcd(n, P)                   (1 when n = 0), C * p' < 2^52
--            policy  on a limit change: 0 keep, 1 scale, 2 reset
--            ttl     least TTL of a written key, ms  [0, 2^53)
-- ARGV[4]  cost                                    [1, C]; 1 for "peek"
-- ARGV[5]  "take" with KEYS[2] only: request-ID memory, microseconds
--          [1, 2^53)
--          For "takes": ARGV[3 + i] is the cost of the i-th take, each
--          [1, C], one per key. The takes are decided one after another at
--          the same time, as separate calls back to back would be; each
--          bucket is read once and written once, and the reply holds one
--          decision per take.
--
-- Numbers are Lua doubles, exact only below 2^53. The spec's numbers are
-- integers by their encoding and must be in range; every text argument
-- must be a canonical decimal integer in its range; every stored number
-- must be in its range; or the script raises an error. Every intermediate
-- stays below 2^53 (the bound is noted beside each step). All checks and
-- arithmetic come before the first write, so a call that fails writes
-- nothing.
--
-- A denial on Redis TIME of a bucket stored under the same spec writes
-- nothing (see quietDenials below); every other decision but "peek"
-- writes each bucket it read.
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
--                microseconds or "n" (never).
-- Reply:         {"ok" | "replay", allowed (0|1), remaining, retry, reset}
--                per cost, as integers, with waits in microseconds or -1
--                (never), or
--                {"conflict", cost, C, n, P} of the request ID's first use.

local TWO52 = 4503599627370496
local TWO53 = 9007199254740992
local MAX_CAPACITY = 1099511627776 -- 2^40, sluice.MaxCapacity
local MAX_TOKENS = 1099511627776   -- 2^40, sluice.MaxTokens
local MAX_PERIOD = 31622400000000  -- 366 days in microseconds, sluice.MaxPeriod
local EPOCH = 1577836800000000     -- 2020-01-01T00:00:00Z, microseconds since 1970
-- Little-endian unsigned integers of 6, 7 and 1 bytes: C, n, n' <= 2^40,
-- P, p' < 2^45 and tokens <= C fit 6; frac < 2^52 and stamp, ttl < 2^53
-- fit 7.
local SPEC = '<I6I6I6I6I6BI7'
local SPEC_LEN = 38
local LEVEL_LEN = 20

-- Library functions as locals. Strings known to hold only digits are
-- converted by arithmetic coercion (s + 0), which reads them as tonumber
-- does without the cost of a function call.
local find, match, format = string.find, string.match, string.format

-- Every call creates the script's functions anew, and a function that
-- refers to an outer local costs a search of the open locals when it is
-- created; a call costs more than the few operations of a division. So the
-- functions every decision runs come first, few and self-contained, with
-- the divisions written out (each as divmod below does it); those of the
-- general path (request IDs, several takes, a new or converted bucket,
-- error messages) are created only after the fast path has returned.

local function fail(msg)
  error({err = 'ERR sluice: ' .. msg})
end

-- level reads a bucket value (a spec and a level), checks it, and returns
-- its limit (C, n', p'), its level tokens + frac/p' brought up to date at
-- now and its stamp (time never runs backwards inside a bucket), then the
-- spec's least TTL, n and P. The numbers are integers by their encoding
-- and checked in range here, so that not even a foreign value makes an
-- intermediate inexact. The refill is sluice.Plan.Refill: (now - stamp) *
-- n' units capped at full. The elapsed time is compared with the time
-- until full before it is multiplied, so (now - stamp) * n' < D < 2^52.
local function level(stored, now)
  local c, n, P, n1, p1, _, ttl, tokens, frac, stamp = struct.unpack('<I6I6I6I6I6BI7I6I7I7', stored)
  if c < 1 or c > 1099511627776 or n1 > 1099511627776 or p1 < 1 or c * p1 >= 4503599627370496 or
      tokens > c or frac >= p1 or stamp >= 9007199254740992 or (tokens == c and frac ~= 0) or
      ttl >= 9007199254740992 then
    error({err = 'ERR sluice: bucket key holds a state sluice did not write'})
  end
  if now > stamp and n1 > 0 and tokens < c then
    local elapsed = now - stamp
    local d = (c - tokens) * p1 - frac -- D < C * p' < 2^52
    local r = d % n1
    if r < 0 then r = r + n1 elseif r >= n1 then r = r - n1 end
    local full = (d - r) / n1 -- ceil(D / n'): microseconds until full
    if r > 0 then full = full + 1 end
    if elapsed >= full then
      return c, n1, p1, c, 0, now, ttl, n, P
    end
    -- elapsed * n' < D, so the sum is below (c - tokens) * p' < 2^52.
    local u = elapsed * n1 + frac
    r = u % p1
    if r < 0 then r = r + p1 elseif r >= p1 then r = r - p1 end
    return c, n1, p1, tokens + (u - r) / p1, r, now, ttl, n, P
  end
  if now > stamp then stamp = now end
  return c, n1, p1, tokens, frac, stamp, ttl, n, P
end

-- wait returns the microseconds, rounded up, until the level tokens +
-- frac/p1 reaches target at n1 units a microsecond: 0 if it has, nil if it
-- never does (n' = 0); below C * p' < 2^52.
local function wait(tokens, frac, target, n1, p1)
  if tokens >= target then return 0 end
  if n1 == 0 then return nil end
  local d = (target - tokens) * p1 - frac
  local r = d % n1
  if r < 0 then r = r + n1 elseif r >= n1 then r = r - n1 end
  if r > 0 then return (d - r) / n1 + 1 end
  return d / n1
end

-- decide takes (or, for a peek, tests) cost tokens from the level tokens +
-- frac/p1 of a bucket of capacity c refilling n1 units a microsecond, and
-- returns whether it allowed, the tokens left, and the waits until cost
-- tokens and until full.
local function decide(tokens, frac, cost, c, n1, p1, peek)
  local allowed = tokens >= cost -- frac is less than one token
  if allowed and not peek then tokens = tokens - cost end
  return allowed, tokens, allowed and 0 or wait(tokens, frac, cost, n1, p1), wait(tokens, frac, c, n1, p1)
end

-- store writes a bucket under spec, with arguments known to be valid. It
-- expires 1 ms after it is full again, that is ceil((stamp - now + reset)
-- / 1000) + 1 ms (the extra ms covers a server whose expiry clock was read
-- before TIME; the sum may exceed 2^53, so each term is divided alone), but
-- not before the spec's least TTL, and never if it never refills.
local function store(key, spec, tokens, frac, stamp, reset, now, least)
  local value = spec .. struct.pack('<I6I7I7', tokens, frac, stamp)
  if reset == nil then
    redis.call('SET', key, value)
    return
  end
  -- x % 1000 is exact for 0 <= x < 2^53: x/1000 < 2^43 is rounded by less
  -- than 2^-10, and its fraction is a multiple of 1/1000, so its floor is.
  local ra, rb = (stamp - now) % 1000, reset % 1000
  local ttl = (stamp - now - ra) / 1000 + (reset - rb) / 1000 + 1
  if ra + rb > 0 then ttl = ttl + 1 end
  if ra + rb > 1000 then ttl = ttl + 1 end
  if ttl < least then ttl = least end
  redis.call('SET', key, value, 'PX', string.format('%d', ttl))
end

-- Arguments.
local op, nargs, nkeys = ARGV[1], #ARGV, #KEYS
local withID = op == 'take' and nkeys == 2
if not ((op == 'take' and nargs == (withID and 5 or 4) and (nkeys == 1 or withID)) or
    (op == 'peek' and nkeys == 1 and nargs == 4) or
    (op == 'takes' and nkeys >= 1 and nargs == 3 + nkeys)) then
  if op ~= 'take' and op ~= 'takes' and op ~= 'peek' then
    fail('operation ' .. format('%q', tostring(op)) .. ' is not "take", "takes" or "peek"')
  end
  fail(nkeys .. ' keys and ' .. nargs .. ' arguments for "' .. op ..
    '"; want 1 key and 4 (take, peek), 2 keys and 5 (take with a request ID), or one key per cost and 3 more (takes)')
end

local now = ARGV[2]
if now == 'redis' then
  local tm = redis.call('TIME') -- two decimal integers
  now = tm[1] * 1000000 + tm[2] - EPOCH
  if not (now >= 0 and now < TWO53) then
    fail('the Redis clock (' .. tm[1] .. ' s) is outside 2020 to 2305')
  end
elseif (now == '0' or find(now, '^[1-9]%d*$')) and now + 0 < TWO53 then
  now = now + 0
else
  now = nil -- refused on the general path, which names the fault
end

-- The spec. A bucket stored under the request's spec (the same bytes)
-- carries it, checked by the call that wrote it, so a take or peek of such
-- a bucket does not check the spec. Every other call checks it in full.
local spec = ARGV[3]
if #spec ~= SPEC_LEN then
  fail(format('spec of %d bytes, want %d', #spec, SPEC_LEN))
end
local first = redis.call('GET', KEYS[1])
local firstSame = first and #first == SPEC_LEN + LEVEL_LEN and find(first, spec, 1, true) == 1
local C, n, P, n1, p1, policy, least
if not firstSame or op == 'takes' then
  C, n, P, n1, p1, policy, least = struct.unpack(SPEC, spec)
  if not (C >= 1 and C <= MAX_CAPACITY and n <= MAX_TOKENS and P >= 1 and P <= MAX_PERIOD and
      n1 <= n and p1 >= 1 and p1 <= P and policy <= 2 and least < TWO53) then
    local function within(what, x, lo, hi)
      if x < lo or x > hi then
        fail(format('%s %d is outside [%d, %d]', what, x, lo, hi))
      end
    end
    within('capacity', C, 1, MAX_CAPACITY)
    within('rate tokens', n, 0, MAX_TOKENS)
    within('rate period', P, 1, MAX_PERIOD)
    within('reduced rate tokens', n1, 0, n)
    within('reduced rate period', p1, 1, P)
    within('limit-change policy', policy, 0, 2)
    within('least TTL', least, 0, TWO53 - 1)
  end
  -- The reduced rate must be n/P in lowest terms: the fraction units of a
  -- stored bucket are counted on that grid. x % y == 0 is exact for
  -- integers below 2^53 (a multiple's quotient is an integer, exactly
  -- representable; otherwise x - floor(x/y)*y is a nonzero integer), and
  -- Euclid's remainders are corrected as in divmod.
  local reduced
  if n == 0 then
    reduced = n1 == 0 and p1 == 1
  else
    reduced = n1 > 0 and P % p1 == 0 and n % n1 == 0 and P / p1 == n / n1
    local x, y = n1, p1
    while reduced and y > 0 do
      local r = x % y
      if r < 0 then r = r + y elseif r >= y then r = r - y end
      x, y = y, r
    end
    reduced = reduced and x == 1
  end
  if not reduced then
    fail(format('reduced rate %d/%d is not %d/%d in lowest terms', n1, p1, n, P))
  end
  if C * p1 >= TWO52 then -- rounding is monotonic, so the comparison is exact
    fail(format('capacity %d times reduced period %d is 2^52 or more: Redis cannot decide this limit exactly', C, p1))
  end
end

-- A denial leaves a bucket's level below its capacity, so refilling the
-- stored state straight to a later time gives exactly what refilling it to
-- now and on from there would (whole units add up; no cap falls between),
-- and the stored TTL already ends when it is full. So a denial on Redis
-- TIME of a bucket stored under the same spec writes nothing, as the model
-- allows. With an explicit time, which a caller may pass out of order, a
-- denial writes its stamp, which must then hold; so does one that
-- converted a bucket to a new limit.
local quietDenials = ARGV[2] == 'redis'

-- The fast path: one take without a request ID, or a peek, of a bucket
-- stored under the spec or missing (full, stamped now), for a cost in
-- range.
if now and not withID and op ~= 'takes' and (firstSame or not first) then
  local tokens, frac, stamp
  if firstSame then
    C, n1, p1, tokens, frac, stamp, least = level(first, now)
  else
    tokens, frac, stamp = C, 0, now
  end
  local cost = 0
  if ARGV[4] == '1' then
    cost = 1
  elseif op == 'take' and find(ARGV[4], '^[1-9]%d*$') then
    cost = ARGV[4] + 0
  end
  if cost >= 1 and cost <= C then
    local allowed, left, retry, reset = decide(tokens, frac, cost, C, n1, p1, op == 'peek')
    if op == 'take' and (allowed or not (quietDenials and firstSame)) then
      store(KEYS[1], spec, left, frac, stamp, reset, now, least)
    end
    return {'ok', allowed and 1 or 0, left, retry or -1, reset or -1}
  end
end

-- The general path: a request ID, several takes, a bucket stored under
-- another spec (converted), or a fault to report.

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
  now = int('time', ARGV[2], 0, TWO53 - 1)
end

-- divmod returns floor(a/b) and a mod b exactly, for integers a >= 0,
-- b >= 1 and a + b < 2^53. Lua computes a % b as a - floor(a/b)*b; a/b is
-- within one of the true quotient, so floor(a/b)*b <= a + b < 2^53 and the
-- subtraction are exact, and r is at most one b outside [0, b), which is
-- corrected. a - r is then q*b exactly, and the division by b is exact.
local function divmod(a, b)
  local r = a % b
  if r < 0 then
    r = r + b
  elseif r >= b then
    r = r - b
  end
  return (a - r) / b, r
end

-- The first bucket, if stored under the spec, is read now, so that the cost
-- can be checked against its C; one under another spec is read by load.
local T1, F1, S1
if firstSame then
  -- The spec is the stored one; for "takes" it was also checked above.
  C, n1, p1, T1, F1, S1, least, n, P = level(first, now)
end

local cost = int('cost', ARGV[4], 1, C)
if op == 'peek' and cost ~= 1 then
  fail('peek cost ' .. ARGV[4] .. ' is not 1')
end
local costs = {cost}
if op == 'takes' then
  for i = 5, nargs do
    costs[i - 3] = int('cost', ARGV[i], 1, C)
  end
end

-- A remembered request ID: the same decision again, or a conflict.
local idTTL
if withID then
  idTTL = int('request-ID memory', ARGV[5], 1, TWO53 - 1)
  local rec = redis.call('GET', KEYS[2])
  if rec then
    local at, rcost, rC, rn, rP, ok, rem, retry, reset = match(rec,
      '^(%d+) (%d+) (%d+) (%d+) (%d+) ([01]) (%d+) ([%dn]+) ([%dn]+)$')
    if not at then
      fail('request-ID key holds a value sluice did not write')
    end
    local at0 = int('stored time', at, 0, TWO53 - 1)
    if now < at0 or now - at0 < idTTL then
      if rcost == ARGV[4] and rC == format('%d', C) and rn == format('%d', n) and rP == format('%d', P) then
        if not (retry == 'n' or find(retry, '^%d+$')) or not (reset == 'n' or find(reset, '^%d+$')) then
          fail('request-ID key holds a value sluice did not write')
        end
        return {'replay', ok + 0, rem + 0, retry == 'n' and -1 or retry + 0, reset == 'n' and -1 or reset + 0}
      end
      return {'conflict', rcost, rC, rn, rP}
    end
  end
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

-- load returns the bucket stored at key (value stored, same if under the
-- request's spec) brought up to date: a missing one is full, stamped now;
-- one stored under another spec is converted to the request's limit.
local function load(stored, same)
  if same then
    local c, a, b, tokens, frac, stamp = level(stored, now)
    if c ~= C or a ~= n1 or b ~= p1 then
      fail('bucket key holds a state sluice did not write')
    end
    return tokens, frac, stamp
  end
  if not stored then
    return C, 0, now
  end
  if #stored ~= SPEC_LEN + LEVEL_LEN then
    fail('bucket key holds a value sluice did not write')
  end
  local C0, a0, b0, t0, f0, stamp, _, n0, P0 = level(stored, now)
  if C0 == C and n0 == n and P0 == P then
    if a0 ~= n1 or b0 ~= p1 then
      fail('bucket key holds a rate reduced otherwise')
    end
    return t0, f0, stamp
  end
  -- Another limit: refilled under the old one by level, then converted,
  -- rounding down; a bucket full under the old limit is full under the new.
  local tokens, frac
  if t0 >= C0 or policy == 2 then
    tokens, frac = C, 0
  elseif policy == 1 then
    -- floor(U * C*p' / (C0*b0)) with U = t0*b0 + f0 < C0*b0 < 2^52.
    tokens, frac = divmod(muldiv(t0 * b0 + f0, C * p1, C0 * b0), p1)
  elseif t0 >= C then
    tokens, frac = C, 0
  else
    tokens, frac = t0, muldiv(f0, p1, b0) -- f0 < b0 < 2^52, p1 < 2^52
  end
  if tokens >= C then
    tokens, frac = C, 0
  end
  return tokens, frac, stamp
end

-- Every bucket read and checked before the first write (K lists the keys
-- in the order first met, at[key] indexes their levels); a key met again
-- continues from the level the takes before left. W[j] says whether the
-- bucket must be written.
local K, at, T, F, S, R, W = {}, {}, {}, {}, {}, {}, {}
for i = 1, #costs do
  local key = KEYS[i]
  if not at[key] then
    local j = #K + 1
    K[j], at[key] = key, j
    if j == 1 then
      if firstSame then
        T[j], F[j], S[j] = T1, F1, S1
      else
        T[j], F[j], S[j] = load(first, false)
      end
      W[j] = not (quietDenials and firstSame)
    else
      local stored = redis.call('GET', key)
      local same = stored and #stored == SPEC_LEN + LEVEL_LEN and find(stored, spec, 1, true) == 1
      T[j], F[j], S[j] = load(stored, same)
      W[j] = not (quietDenials and same)
    end
  end
end
local reply = {}
for i = 1, #costs do
  local j = at[KEYS[i]]
  local allowed, retry
  allowed, T[j], retry, R[j] = decide(T[j], F[j], costs[i], C, n1, p1, op == 'peek')
  W[j] = W[j] or allowed
  local r = 5 * (i - 1)
  reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4], reply[r + 5] =
    'ok', allowed and 1 or 0, T[j], retry or -1, R[j] or -1
end
if op == 'peek' then
  return reply
end
for j = 1, #K do
  if W[j] then
    store(K[j], spec, T[j], F[j], S[j], R[j], now, least)
  end
end
if withID then
  local rec = format('%d %s %d %d %d %d %d %s %s', now, ARGV[4], C, n, P,
    reply[2], reply[3], reply[4] >= 0 and format('%d', reply[4]) or 'n', reply[5] >= 0 and format('%d', reply[5]) or 'n')
  local q, r = divmod(idTTL, 1000)
  local ttl = q + 1
  if r > 0 then ttl = ttl + 1 end
  if ttl < least then ttl = least end
  redis.call('SET', KEYS[2], rec, 'PX', format('%d', ttl))
end
return reply
