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
-- ARGV[3]  capacity C                        [1, 2^40]
-- ARGV[4]  rate tokens n                     [0, 2^40]
-- ARGV[5]  rate period P, microseconds       [1, 366 days]
-- ARGV[6]  n' = n / gcd(n, P)                (0 when n = 0)
-- ARGV[7]  p' = P / gcd(n, P)                (1 when n = 0), C * p' < 2^52
-- ARGV[8]  cost                              [1, C]; 1 for "peek"
-- ARGV[9]  limit-change policy               0 keep, 1 scale, 2 reset
-- ARGV[10] least TTL of a written key, ms    [0, 2^53)
-- ARGV[11] request-ID memory, microseconds   [1, 2^53) with KEYS[2], else 0
-- ARGV[12...] for "takes": the costs of the 2nd, 3rd... take, each [1, C].
--          The takes are decided one after another at the same time, as
--          separate calls back to back would be; each bucket is read once
--          and written once, and the reply holds one decision per take.
--
-- Numbers are Lua doubles, exact only below 2^53. Every argument must be a
-- canonical decimal integer in its range, and every stored number digits
-- in its range, or the script raises an error; every intermediate stays
-- below 2^53 (the bound is noted beside each step). All checks and
-- arithmetic come before the first write, so a call that fails writes
-- nothing.
--
-- A denial on Redis TIME of a bucket stored under the same limit writes
-- nothing (see quietDenials below); every other decision but "peek"
-- writes each bucket it read.
--
-- Bucket value:  "C n P n' p' tokens frac stamp"; the level is
--                tokens + frac/p', brought up to date at microsecond stamp.
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

-- Library functions as locals. Strings known to hold only digits are
-- converted by arithmetic coercion (s + 0), which reads them as tonumber
-- does without the cost of a function call.
local type = type
local find, match, sub, format = string.find, string.match, string.sub, string.format

local function fail(msg)
  error({err = 'ERR sluice: ' .. msg})
end

local function show(s)
  if type(s) ~= 'string' then return type(s) end
  if #s > 24 then s = sub(s, 1, 24) .. '...' end
  return format('%q', s)
end

-- str formats an integer exactly (tostring would use %.14g); nil is "n".
local function str(x)
  if x == nil then return 'n' end
  return format('%d', x)
end

-- int parses s, which must be a canonical decimal integer (digits only, no
-- leading zero) in [lo, hi], hi < 2^53. This refuses "nan", "inf", "1e309",
-- "0x10", "-0", " 12 ", "" and 9007199254740993: digits alone leave tonumber
-- no other reading, and a number of 2^53 or more rounds to 2^53 or more, so
-- the range check refuses it.
local function int(what, s, lo, hi)
  if not (s == '0' or (type(s) == 'string' and find(s, '^[1-9]%d*$'))) then
    fail(what .. ' ' .. show(s) .. ' is not a decimal integer')
  end
  local x = s + 0
  if x < lo or x > hi then
    fail(what .. ' ' .. s .. ' is outside [' .. str(lo) .. ', ' .. str(hi) .. ']')
  end
  return x
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

-- ceildiv returns ceil(a/b) under the conditions of divmod.
local function ceildiv(a, b)
  local q, r = divmod(a, b)
  if r > 0 then q = q + 1 end
  return q
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

-- refill brings the level tokens + frac/p1 of a bucket of capacity c up to
-- date from stamp to at (>= stamp), adding (at - stamp) * n1 units capped at
-- full, as sluice.Plan.Refill does. The elapsed time is compared with the
-- time until full before it is multiplied, so (at - stamp) * n1 < D < 2^52.
local function refill(tokens, frac, stamp, c, n1, p1, at)
  if at > stamp and n1 > 0 and tokens < c then
    local deficit = (c - tokens) * p1 - frac -- D < C * p' < 2^52
    if at - stamp >= ceildiv(deficit, n1) then
      return c, 0
    end
    -- (at - stamp) * n1 < D, so the sum is below (c - tokens) * p1 < 2^52.
    local q, r = divmod((at - stamp) * n1 + frac, p1)
    return tokens + q, r
  end
  return tokens, frac
end

-- wait returns the microseconds, rounded up, until the level reaches target;
-- 0 if it has, nil if it never does (n' = 0).
local function wait(tokens, frac, n1, p1, target)
  if tokens >= target then return 0 end
  if n1 == 0 then return nil end
  return ceildiv((target - tokens) * p1 - frac, n1) -- < C * p' < 2^52
end

-- ceilms returns ceil((a + b) / 1000) for 0 <= a, b < 2^53 without forming
-- a + b, which may exceed 2^53.
local function ceilms(a, b)
  local qa, ra = divmod(a, 1000)
  local qb, rb = divmod(b, 1000)
  local q, r = qa + qb, ra + rb
  if r > 0 then q = q + 1 end
  if r > 1000 then q = q + 1 end
  return q
end

-- Arguments.
local op = ARGV[1]
if op ~= 'take' and op ~= 'takes' and op ~= 'peek' then
  fail('operation ' .. show(op) .. ' is not "take", "takes" or "peek"')
end
if op == 'takes' then
  if #ARGV < 11 or #KEYS ~= #ARGV - 10 then
    fail(#KEYS .. ' keys and ' .. #ARGV .. ' arguments for "takes", want one key per cost')
  end
elseif #ARGV ~= 11 then
  fail(#ARGV .. ' arguments, want 11')
end
local withID = op == 'take' and #KEYS == 2
if op ~= 'takes' and #KEYS ~= 1 and not withID then
  fail(#KEYS .. ' keys for "' .. op .. '"')
end

local now
if ARGV[2] == 'redis' then
  local tm = redis.call('TIME') -- two decimal integers
  now = tm[1] * 1000000 + tm[2] - EPOCH
  if not (now >= 0 and now < TWO53) then
    fail('the Redis clock (' .. tm[1] .. ' s) is outside 2020 to 2305')
  end
else
  now = int('time', ARGV[2], 0, TWO53 - 1)
end

-- The limit. A bucket's value starts with the text of the limit it was
-- last written under, "C n P n' p' ", which the call that wrote it checked
-- in full. When the first bucket holds the request's limit text, the same
-- five arguments are known good and are only converted; otherwise they are
-- checked here: all five at once, and one by one only if that fails, to
-- name the argument at fault.
local limitSp = ARGV[3] .. ' ' .. ARGV[4] .. ' ' .. ARGV[5] .. ' ' .. ARGV[6] .. ' ' .. ARGV[7] .. ' '
local first = redis.call('GET', KEYS[1])
local firstSame = first and find(first, limitSp, 1, true) == 1
local C, n, P, n1, p1
-- Five runs of digits, each alone in its argument (an argument holding a
-- space would leave another one empty, and two spaces in a row), none
-- with a leading zero: five canonical integers.
if firstSame or (find(limitSp, '^%d+ %d+ %d+ %d+ %d+ $') and not find(limitSp, '^0%d') and not find(limitSp, ' 0%d')) then
  C, n, P, n1, p1 = ARGV[3] + 0, ARGV[4] + 0, ARGV[5] + 0, ARGV[6] + 0, ARGV[7] + 0
end
if not (firstSame or (C and C >= 1 and C <= MAX_CAPACITY and n <= MAX_TOKENS and
    P >= 1 and P <= MAX_PERIOD and n1 <= n and p1 >= 1 and p1 <= P)) then
  C = int('capacity', ARGV[3], 1, MAX_CAPACITY)
  n = int('rate tokens', ARGV[4], 0, MAX_TOKENS)
  P = int('rate period', ARGV[5], 1, MAX_PERIOD)
  n1 = int('reduced rate tokens', ARGV[6], 0, n)
  p1 = int('reduced rate period', ARGV[7], 1, P)
end
if not firstSame then
  -- The reduced rate must be n/P in lowest terms: the fraction units of a
  -- stored bucket are counted on that grid.
  if n == 0 then
    if n1 ~= 0 or p1 ~= 1 then
      fail('a rate of 0 tokens must be reduced to 0 per 1, not ' .. ARGV[6] .. '/' .. ARGV[7])
    end
  else
    local reduced = n1 > 0
    if reduced then
      local gp, rp = divmod(P, p1)
      local gn, rn = divmod(n, n1)
      reduced = rp == 0 and rn == 0 and gp == gn
    end
    local x, y = n1, p1
    while reduced and y > 0 do
      local _, r = divmod(x, y)
      x, y = y, r
    end
    if not reduced or x ~= 1 then
      fail('reduced rate ' .. ARGV[6] .. '/' .. ARGV[7] .. ' is not ' .. ARGV[4] .. '/' .. ARGV[5] .. ' in lowest terms')
    end
  end
  if C * p1 >= TWO52 then -- rounding is monotonic, so the comparison is exact
    fail('capacity ' .. ARGV[3] .. ' times reduced period ' .. ARGV[7] .. ' is 2^52 or more: Redis cannot decide this limit exactly')
  end
end

local cost = int('cost', ARGV[8], 1, C)
if op == 'peek' and cost ~= 1 then
  fail('peek cost ' .. ARGV[8] .. ' is not 1')
end
local costs -- "takes" only
if op == 'takes' then
  costs = {cost}
  for i = 12, #ARGV do
    costs[i - 10] = int('cost', ARGV[i], 1, C)
  end
end
local policy = ARGV[9] -- compared as text below
if policy ~= '0' and policy ~= '1' and policy ~= '2' then
  fail('limit-change policy ' .. show(policy) .. ' is not 0, 1 or 2')
end
local minTTL = int('least TTL', ARGV[10], 0, TWO53 - 1)
local idTTL
if withID then
  idTTL = int('request-ID memory', ARGV[11], 1, TWO53 - 1)
elseif ARGV[11] ~= '0' then
  fail('request-ID memory ' .. show(ARGV[11]) .. ' is not 0 without a request ID')
end

-- A remembered request ID: the same decision again, or a conflict.
if withID then
  local rec = redis.call('GET', KEYS[2])
  if rec then
    local at, rcost, rC, rn, rP, ok, rem, retry, reset = match(rec,
      '^(%d+) (%d+) (%d+) (%d+) (%d+) ([01]) (%d+) ([%dn]+) ([%dn]+)$')
    if not at then
      fail('request-ID key holds a value sluice did not write')
    end
    local first = int('stored time', at, 0, TWO53 - 1)
    if now < first or now - first < idTTL then
      if rcost == ARGV[8] and rC == ARGV[3] and rn == ARGV[4] and rP == ARGV[5] then
        if not (retry == 'n' or find(retry, '^%d+$')) or not (reset == 'n' or find(reset, '^%d+$')) then
          fail('request-ID key holds a value sluice did not write')
        end
        return {'replay', ok + 0, rem + 0, retry == 'n' and -1 or retry + 0, reset == 'n' and -1 or reset + 0}
      end
      return {'conflict', rcost, rC, rn, rP}
    end
  end
end

-- load returns the bucket at key brought up to date: a missing one is
-- full, stamped now; time never runs backwards inside a bucket. The stored
-- value starts with the limit's text; when it is the request's limit (same),
-- whose arguments were checked above, only the level and stamp are parsed:
-- digits (so the conversion has one reading) in range (so exact). stored
-- is the key's value, read by the caller.
local function load(stored, same)
  local tokens, frac, stamp = C, 0, now
  if same then
    local t0, f0, s0 = match(stored, '^(%d+) (%d+) (%d+)$', #limitSp + 1)
    if not t0 then
      fail('bucket key holds a value sluice did not write')
    end
    t0, f0, s0 = t0 + 0, f0 + 0, s0 + 0
    if t0 > C or f0 >= p1 or s0 >= TWO53 or (t0 == C and f0 ~= 0) then
      fail('bucket key holds a state sluice did not write')
    end
    if s0 > now then stamp = s0 end
    tokens, frac = refill(t0, f0, s0, C, n1, p1, stamp)
  elseif stored then
    local f = {match(stored,
      '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+)$')}
    if #f ~= 8 then
      fail('bucket key holds a value sluice did not write')
    end
    local C0 = int('stored capacity', f[1], 1, MAX_CAPACITY)
    local n0 = int('stored rate tokens', f[2], 0, MAX_TOKENS)
    local P0 = int('stored rate period', f[3], 1, MAX_PERIOD)
    local a0 = int('stored reduced rate tokens', f[4], 0, n0)
    local b0 = int('stored reduced rate period', f[5], 1, P0)
    local t0 = int('stored tokens', f[6], 0, C0)
    local f0 = int('stored fraction', f[7], 0, b0 - 1)
    local s0 = int('stored stamp', f[8], 0, TWO53 - 1)
    if C0 * b0 >= TWO52 or (t0 == C0 and f0 ~= 0) then
      fail('bucket key holds a state sluice did not write')
    end
    if s0 > now then stamp = s0 end
    if C0 == C and n0 == n and P0 == P then
      if a0 ~= n1 or b0 ~= p1 then
        fail('bucket key holds a rate reduced otherwise')
      end
      tokens, frac = refill(t0, f0, s0, C, n1, p1, stamp)
    else
      -- Another limit: refill under the old one, then convert, rounding
      -- down; a bucket full under the old limit is full under the new one.
      t0, f0 = refill(t0, f0, s0, C0, a0, b0, stamp)
      if t0 >= C0 or policy == '2' then
        tokens, frac = C, 0
      elseif policy == '1' then
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
    end
  end
  return tokens, frac, stamp
end

-- decide takes (or, for "peek", tests) c tokens from the level tokens +
-- frac/p1 and returns whether it allowed, the tokens left, and the waits in
-- microseconds until c tokens and until full (nil: never).
local function decide(tokens, frac, c)
  local allowed = tokens >= c -- frac is less than one token
  if allowed and op ~= 'peek' then tokens = tokens - c end
  local retry = 0
  if not allowed then
    retry = wait(tokens, frac, n1, p1, c)
  end
  return allowed, tokens, retry, wait(tokens, frac, n1, p1, C)
end

-- store writes a bucket, with arguments known to be valid. It expires 1 ms
-- after it is full again (rounded up to ms; the extra ms covers a server
-- whose expiry clock was read before TIME), and never if it never refills.
local function store(key, tokens, frac, stamp, reset)
  local value = format('%s%d %d %d', limitSp, tokens, frac, stamp)
  if reset == nil then
    redis.call('SET', key, value)
  else
    local ttl = ceilms(stamp - now, reset) + 1
    if ttl < minTTL then ttl = minTTL end
    redis.call('SET', key, value, 'PX', str(ttl))
  end
end

-- A denial leaves a bucket's level below its capacity, so refilling the
-- stored state straight to a later time gives exactly what refilling it to
-- now and on from there would (whole units add up; no cap falls between),
-- and the stored TTL already ends when it is full. So a denial on Redis
-- TIME of a bucket stored under the same limit writes nothing, as the
-- model allows. With an explicit time, which a caller may pass out of
-- order, a denial writes its stamp, which must then hold; so does one that
-- converted a bucket to a new limit.
local quietDenials = ARGV[2] == 'redis'

-- One take or peek.
if op ~= 'takes' then
  local tokens, frac, stamp = load(first, firstSame)
  local allowed, left, retry, reset = decide(tokens, frac, cost)
  local reply = {'ok', allowed and 1 or 0, left, retry or -1, reset or -1}
  if op == 'peek' then
    return reply
  end
  if allowed or not (quietDenials and firstSame) then
    store(KEYS[1], left, frac, stamp, reset)
  end
  if withID then
    local rec = format('%d %s %s %s %s %d %d %s %s', now, ARGV[8], ARGV[3], ARGV[4], ARGV[5],
      reply[2], left, str(retry), str(reset))
    local ttl = ceilms(idTTL, 0) + 1
    if ttl < minTTL then ttl = minTTL end
    redis.call('SET', KEYS[2], rec, 'PX', str(ttl))
  end
  return reply
end

-- Takes: every bucket read and checked before the first write (K lists
-- the keys in the order first met, at[key] indexes their levels); a key met
-- again continues from the level the takes before left.
-- W[j] says whether the bucket must be written.
local K, at, T, F, S, R, W = {}, {}, {}, {}, {}, {}, {}
for i = 1, #KEYS do
  local key = KEYS[i]
  if not at[key] then
    local j = #K + 1
    K[j], at[key] = key, j
    local stored, same = first, firstSame -- KEYS[1], read above
    if j > 1 then
      stored = redis.call('GET', key)
      same = stored and find(stored, limitSp, 1, true) == 1
    end
    T[j], F[j], S[j] = load(stored, same)
    W[j] = not (quietDenials and same)
  end
end
local reply = {}
for i = 1, #costs do
  local j = at[KEYS[i]]
  local allowed, retry
  allowed, T[j], retry, R[j] = decide(T[j], F[j], costs[i])
  W[j] = W[j] or allowed
  local r = 5 * (i - 1)
  reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4], reply[r + 5] =
    'ok', allowed and 1 or 0, T[j], retry or -1, R[j] or -1
end
for j = 1, #K do
  if W[j] then
    store(K[j], T[j], F[j], S[j], R[j])
  end
end
return reply
