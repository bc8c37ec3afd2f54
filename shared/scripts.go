package shared

import "github.com/redis/go-redis/v9"

// The lane state of one (key fingerprint, model pool) lives in seven Redis
// keys with one hash tag, so a cluster keeps them on one shard:
//
//	KEYS[1] state  hash: limit, gen, cuts, slow, last_grow, bound_at,
//	               hold_until, nora, others_until, cap, n429, hdr, hdr_at
//	KEYS[2] held   hash proc → slots the process holds (its grant, or its
//	               in-flight count when that is larger)
//	KEYS[3] want   hash proc → slots it wants
//	KEYS[4] infl   hash proc → requests it has in flight
//	KEYS[5] exp    zset proc → when its slots may be reclaimed (ms of Redis
//	               time): its lease's end plus the grace (see Config.Grace)
//	KEYS[6] r429   list of recent 429 times (ms), newest first
//	KEYS[7] caps   hash proc → the cap that process asked for
//
// The cap of a lane is the smallest any live process asked for: no process
// raises it for the others by passing a larger --cap.
//
// Every step is one script run on Redis' own clock (TIME): no process's
// clock is trusted, and no two steps interleave.

// luaPrelude loads the lane state (initialising it on first use) and
// returns dead leases to the pool. It defines now, cap (the lane's: the
// smallest any live process asked for), limit, gen, cuts, slow, lastGrow,
// boundAt, holdUntil, nora, othersUntil and reclaimed.
const luaPrelude = `
local st, held, want, infl, exp, r429, capk = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local proc = ARGV[1]
local cap = tonumber(ARGV[2])
local startf = tonumber(ARGV[3])
local minl = tonumber(ARGV[4])
local s = redis.call('HMGET', st, 'limit', 'gen', 'cuts', 'slow', 'last_grow', 'bound_at', 'hold_until', 'nora', 'others_until')
local limit = tonumber(s[1])
local gen, cuts, slow, lastGrow, boundAt, holdUntil, nora, othersUntil
if not limit then
  limit = math.min(cap, math.max(minl, math.floor(cap * startf)))
  gen, cuts, slow, lastGrow, boundAt, holdUntil, nora, othersUntil = 0, 0, 1, now, 0, 0, 0, 0
else
  gen = tonumber(s[2]) or 0
  cuts = tonumber(s[3]) or 0
  slow = tonumber(s[4]) or 1
  lastGrow = tonumber(s[5]) or now
  boundAt = tonumber(s[6]) or 0
  holdUntil = tonumber(s[7]) or 0
  nora = tonumber(s[8]) or 0
  othersUntil = tonumber(s[9]) or 0
end
local reclaimed = 0
local dead = redis.call('ZRANGEBYSCORE', exp, '-inf', '(' .. now)
for _, p in ipairs(dead) do
  if p ~= proc then
    reclaimed = reclaimed + (tonumber(redis.call('HGET', held, p)) or 0)
    redis.call('HDEL', held, p)
    redis.call('HDEL', want, p)
    redis.call('HDEL', infl, p)
    redis.call('HDEL', capk, p)
    redis.call('ZREM', exp, p)
  end
end
redis.call('HSET', capk, proc, cap)
for _, p in ipairs(redis.call('ZRANGE', exp, 0, -1)) do
  local c = tonumber(redis.call('HGET', capk, p))
  if c and c < cap then cap = c end
end
if limit > cap then limit = cap end
local function save()
  redis.call('HSET', st, 'limit', tostring(limit), 'gen', gen, 'cuts', cuts, 'slow', slow,
    'last_grow', lastGrow, 'bound_at', boundAt, 'hold_until', holdUntil, 'nora', nora,
    'others_until', othersUntil, 'cap', cap)
  -- A key nobody has used for a day leaves nothing behind.
  for i = 1, 7 do redis.call('PEXPIRE', KEYS[i], 86400000) end
end
`

// acquireScript renews this process's lease and sets its grant.
//
// ARGV: proc, cap, start fraction, min limit, want, in flight, ttl ms,
// ramp per s, increase per s, speed, success seen (0/1), others for ms
// (this process's reserve; 0: none), header snapshot ("" or
// "reqLim,reqRem,inLim,inRem,outLim,outRem"), header age ms, requests in
// flight now, and what a key's own budget still held when this process
// moved from it (see moveScript): its name ("": none), slots, ms left and
// sequence number. The sixth, "in flight", is what the process may have in
// flight while this call is under way: the larger of its requests in
// flight and its current grant, so a grant that shrinks is recorded only
// once the process knows of it. The seventh is the lease's TTL plus the
// grace: the others reclaim this process's slots only that long after this
// renewal, while the process itself stops admitting at the lease's end.
//
// On a key's own budget that has moved to its organisation's (moveScript
// marked it), the process is granted nothing: it is told the organisation
// and moves too; what it may have in flight stays recorded as held.
//
// What a key's budget held when a process moved from it is recorded on the
// organisation's budget as one more holder that wants nothing (named
// "~key:" and the key's fingerprint; no host name has a "~"), for as long
// as it could be reclaimed on the key's budget, unless a later move (a
// higher sequence number) has said otherwise: the processes still on the
// key's budget may have that much in flight, which the organisation's
// budget must leave room for.
//
// Returns {grant, limit, gen, cuts, hold ms, active, others ms, procs,
// reclaimed, header snapshot, header age ms, in flight of all, cap, the
// organisation this key's budget moved to ("": none)}.
var acquireScript = redis.NewScript(luaPrelude + `
local movedTo = redis.call('HGET', st, 'org') or ''
local left = ARGV[16]
if left ~= '' then
  local seq = tonumber(ARGV[19])
  local seqk = 'left_seq:' .. left
  local last = tonumber(redis.call('HGET', st, seqk)) or -1
  if seq > last then
    redis.call('HSET', st, seqk, seq)
    local n, ms = tonumber(ARGV[17]), tonumber(ARGV[18])
    if n > 0 and ms > 0 then
      redis.call('HSET', held, left, n)
      redis.call('HSET', want, left, 0)
      redis.call('ZADD', exp, now + ms, left)
    else
      redis.call('HDEL', held, left)
      redis.call('HDEL', want, left)
      redis.call('ZREM', exp, left)
    end
  end
end
local wantMe = tonumber(ARGV[5])
if movedTo ~= '' then wantMe = 0 end
local inflMe = tonumber(ARGV[6])
local ttl = tonumber(ARGV[7])
local ramp = tonumber(ARGV[8])
local inc = tonumber(ARGV[9])
local speed = tonumber(ARGV[10])
if ARGV[11] == '1' then nora = 0 end
local oth = tonumber(ARGV[12])
if oth > 0 and now + oth > othersUntil then othersUntil = now + oth end
if ARGV[13] ~= '' then
  redis.call('HSET', st, 'hdr', ARGV[13], 'hdr_at', now - tonumber(ARGV[14]))
end
redis.call('ZADD', exp, now + ttl, proc)
redis.call('HSET', want, proc, wantMe)
redis.call('HSET', infl, proc, tonumber(ARGV[15]))
if redis.call('HEXISTS', held, proc) == 0 then redis.call('HSET', held, proc, inflMe) end

local procs = redis.call('ZRANGE', exp, 0, -1)
local H, W = {}, {}
local sumWant, sumInfl = 0, 0
local nprocs = 0
for _, p in ipairs(procs) do
  if string.sub(p, 1, 1) ~= '~' then nprocs = nprocs + 1 end
  H[p] = tonumber(redis.call('HGET', held, p)) or 0
  W[p] = tonumber(redis.call('HGET', want, p)) or 0
  sumWant = sumWant + W[p]
  sumInfl = sumInfl + (tonumber(redis.call('HGET', infl, p)) or 0)
end

-- Additive growth for the time since the last step, if the lane was
-- limit-bound in that time (someone wanted more than the limit gave).
local dt = now - lastGrow
if dt > 0 then
  if boundAt >= lastGrow and sumInfl > 0 then
    local rate = inc
    if slow == 1 then rate = ramp end
    limit = math.min(cap, limit + rate * dt / 1000 * speed)
  end
  lastGrow = now
end
local L = math.floor(limit)
if sumWant >= L then boundAt = now end

-- Fair shares: the limit split evenly over the processes that want
-- slots (sorted by name, so every process computes the same split); a
-- share nobody claims is free for whoever wants it. The remainder slots
-- rotate over the processes, one step a second of Redis time, so that no
-- process always has one more than the others.
local active = {}
for _, p in ipairs(procs) do
  if W[p] > 0 then table.insert(active, p) end
end
table.sort(active)
local n = #active
local turn = math.floor(now / 1000)
local function fair(rank)
  if n == 0 then return 0 end
  local f = math.floor(L / n)
  if (rank - 1 + turn) % n < L % n then f = f + 1 end
  return f
end
local claims = 0
for rank, p in ipairs(active) do
  if p ~= proc then
    claims = claims + math.max(H[p], math.min(W[p], fair(rank)))
  end
end
for _, p in ipairs(procs) do
  if p ~= proc and W[p] == 0 then claims = claims + H[p] end
end
local grant = math.min(wantMe, L - claims)
if grant < 0 then grant = 0 end
redis.call('HSET', held, proc, math.max(grant, inflMe))
save()
local holdMs = 0
if holdUntil > now then holdMs = holdUntil - now end
local othMs = 0
if othersUntil > now then othMs = othersUntil - now end
local h = redis.call('HMGET', st, 'hdr', 'hdr_at')
local hdrAge = -1
if h[2] then hdrAge = now - tonumber(h[2]) end
return {grant, tostring(limit), gen, cuts, holdMs, n, othMs, nprocs, reclaimed, h[1] or '', hdrAge, sumInfl, cap, movedTo}
`)

// congestionScript applies a 429 (or 529): one multiplicative cut per
// congestion epoch for all processes, for a 429 the buckets explain (see
// gate.BucketsRefused), and a hold for retry-after (or, without one, a
// back-off growing per epoch up to a cap: gate.ProbeBackoff).
//
// ARGV: proc, cap, start fraction, min limit, epoch at admission, rate
// limited (0/1), retry-after ms (-1: none), decrease, speed, may cut
// (0/1), longest back-off in server seconds.
//
// Returns {cut (0/1), limit, gen, cuts, hold ms}.
var congestionScript = redis.NewScript(luaPrelude + `
local epoch = tonumber(ARGV[5])
local rateLimited = ARGV[6] == '1'
local ra = tonumber(ARGV[7])
local decrease = tonumber(ARGV[8])
local speed = tonumber(ARGV[9])
local mayCut = ARGV[10] == '1'
local maxBackoff = tonumber(ARGV[11])
local newEpoch = epoch == gen
local cut = 0
if rateLimited then
  redis.call('HINCRBY', st, 'n429', 1)
  redis.call('LPUSH', r429, now)
  redis.call('LTRIM', r429, 0, 999)
end
if newEpoch and rateLimited and mayCut then
  limit = math.max(minl, math.floor(limit * decrease))
  gen = gen + 1
  cuts = cuts + 1
  slow = 0
  cut = 1
end
local hold = 0
if ra >= 0 then
  hold = ra
elseif newEpoch then
  nora = nora + 1
  hold = math.floor(math.min(maxBackoff, 0.5 * 2 ^ (nora - 1)) / speed * 1000)
end
if hold > 0 and now + hold > holdUntil then holdUntil = now + hold end
save()
local holdMs = 0
if holdUntil > now then holdMs = holdUntil - now end
return {cut, tostring(limit), gen, cuts, holdMs}
`)

// moveScript moves this process from a key's own budget to its
// organisation's: it hands the process's slots back, marks the budget as
// moved (every process renewing on it from now on is granted nothing and
// told the organisation: see acquireScript), and returns what the others
// still hold on it (slots, and ms until the last of them could be
// reclaimed) with a sequence number that orders the moves from this key.
// KEYS as above; ARGV: proc, organisation.
var moveScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local proc = ARGV[1]
redis.call('HDEL', KEYS[2], proc)
redis.call('HDEL', KEYS[3], proc)
redis.call('HDEL', KEYS[4], proc)
redis.call('ZREM', KEYS[5], proc)
redis.call('HDEL', KEYS[7], proc)
redis.call('HSET', KEYS[1], 'org', ARGV[2])
local seq = redis.call('HINCRBY', KEYS[1], 'moves', 1)
for i = 1, 7 do redis.call('PEXPIRE', KEYS[i], 86400000) end
local n, last = 0, now
for _, p in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], now, '+inf')) do
  n = n + (tonumber(redis.call('HGET', KEYS[2], p)) or 0)
  local e = tonumber(redis.call('ZSCORE', KEYS[5], p))
  if e > last then last = e end
end
return {n, last - now, seq}
`)

// releaseScript hands this process's slots back at once (it has finished).
// KEYS as above; ARGV: proc.
var releaseScript = redis.NewScript(`
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('HDEL', KEYS[7], ARGV[1])
return 1
`)

// The shared spend budget (Spend) lives in Redis keys with one hash tag,
// so a cluster keeps them on one shard:
//
//	budget:<key>  hash: spent, held, reserved (nanodollars), and one field
//	              counted:<owner> per gateway: what this budget has counted
//	              of that gateway's spend (its reservations' charges and
//	              keeps, and what seeding added from its ledger). Its
//	              presence also says the budget holds that gateway's
//	              ledger: a Redis that lost its data lacks it.
//	res:<owner>   hash id → "left charged tag budget-key…": the open
//	              reservations of one gateway (its state directory's id)
//	alive:<owner> string, with a TTL the gateway renews while it runs
//
// A reservation is admitted and recorded in one script run, and ended in
// one, so every gateway sees every other's reservations at once.

// spendReserveScript: KEYS[1] the owner's reservations, KEYS[2..] the
// budgets; ARGV id, worst, force ("1": whatever the caps say), tag (a
// word; "-" for none), owner ("" : not checked), charged (what the
// reservation was charged already: a reservation made again after Redis
// lost it; it is added to spent), then each budget's cap (0: none). It
// returns {0} when reserved (or when id was reserved already: a retry),
// {-1} when owner is given and a budget lacks counted:<owner> (Redis lost
// the budget: it must be seeded again before it judges anything), else
// {i, spent, held, reserved} of the first budget i (1-based) that worst
// would pass.
var spendReserveScript = redis.NewScript(`
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return {0} end
local worst, charged = tonumber(ARGV[2]), tonumber(ARGV[6])
if ARGV[5] ~= '' then
  for i = 2, #KEYS do
    if redis.call('HEXISTS', KEYS[i], 'counted:' .. ARGV[5]) == 0 then return {-1} end
  end
end
if ARGV[3] ~= '1' then
  for i = 2, #KEYS do
    local cap = tonumber(ARGV[i + 5])
    if cap > 0 then
      local f = redis.call('HMGET', KEYS[i], 'spent', 'held', 'reserved')
      local s, h, r = tonumber(f[1]) or 0, tonumber(f[2]) or 0, tonumber(f[3]) or 0
      if s + h + r + worst > cap then return {i - 1, s, h, r} end
    end
  end
end
local names = {}
for i = 2, #KEYS do
  redis.call('HINCRBY', KEYS[i], 'reserved', ARGV[2])
  if charged > 0 then
    redis.call('HINCRBY', KEYS[i], 'spent', ARGV[6])
    if ARGV[5] ~= '' then redis.call('HINCRBY', KEYS[i], 'counted:' .. ARGV[5], ARGV[6]) end
  end
  names[#names + 1] = KEYS[i]
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ' ' .. ARGV[6] .. ' ' .. ARGV[4] .. ' ' .. table.concat(names, ' '))
return {0}
`)

// spendEndScript: KEYS[1] the owner's reservations, KEYS[2..] the
// reservation's budgets; ARGV id, op (charge, settle, release, keep),
// amount, owner. A charge moves amount to spent (what is left reserved
// shrinks by as much, to 0); a settle charges what amount adds to the
// charges and frees the rest; a release frees the rest; a keep moves the
// rest to held, for good. What goes to spent or held is added to
// counted:<owner> too. An id not open does nothing (returns 0): ends are
// idempotent (a retry of an end whose answer was lost must not count
// twice).
var spendEndScript = redis.NewScript(`
local rec = redis.call('HGET', KEYS[1], ARGV[1])
if not rec then return 0 end
local l, c = string.match(rec, '^(%-?%d+) (%-?%d+)')
local left, charged = tonumber(l), tonumber(c)
local op, amount = ARGV[2], tonumber(ARGV[3])
local counted = 'counted:' .. ARGV[4]
local function charge(x)
  local d = math.min(x, left)
  for i = 2, #KEYS do
    redis.call('HINCRBY', KEYS[i], 'spent', string.format('%d', x))
    redis.call('HINCRBY', KEYS[i], counted, string.format('%d', x))
    redis.call('HINCRBY', KEYS[i], 'reserved', string.format('%d', -d))
  end
  left, charged = left - d, charged + x
end
if op == 'charge' then
  if amount > 0 then charge(amount) end
  local rest = string.match(rec, '^%-?%d+ %-?%d+(.*)$')
  redis.call('HSET', KEYS[1], ARGV[1], string.format('%d %d', left, charged) .. rest)
  return 1
end
if op == 'settle' and amount > charged then charge(amount - charged) end
for i = 2, #KEYS do
  redis.call('HINCRBY', KEYS[i], 'reserved', string.format('%d', -left))
  if op == 'keep' then
    redis.call('HINCRBY', KEYS[i], 'held', string.format('%d', left))
    redis.call('HINCRBY', KEYS[i], counted, string.format('%d', left))
  end
end
redis.call('HDEL', KEYS[1], ARGV[1])
return 1
`)

// spendSeedScript brings budget KEYS[1] up to owner ARGV[1]'s ledger,
// ARGV[2]: it adds to spent what the ledger holds beyond counted:<owner>
// (what the budget already counted of that gateway), and sets the field,
// so seeding again adds only what the ledger gained meanwhile (spend
// counted while the gateway ran without --shared, or while Redis was out
// of reach). It returns what it added. A budget seeded by a gateway
// before the counted fields existed (a seeded:<owner> field) is taken as
// holding the ledger, as it did then.
var spendSeedScript = redis.NewScript(`
local ledger = tonumber(ARGV[2])
local counted = 'counted:' .. ARGV[1]
if redis.call('HEXISTS', KEYS[1], counted) == 0 and redis.call('HDEL', KEYS[1], 'seeded:' .. ARGV[1]) == 1 then
  redis.call('HSET', KEYS[1], counted, ARGV[2])
  return 0
end
local add = ledger - (tonumber(redis.call('HGET', KEYS[1], counted)) or 0)
if add <= 0 then
  redis.call('HINCRBY', KEYS[1], counted, 0)
  return 0
end
redis.call('HINCRBY', KEYS[1], 'spent', string.format('%d', add))
redis.call('HINCRBY', KEYS[1], counted, string.format('%d', add))
return add
`)
