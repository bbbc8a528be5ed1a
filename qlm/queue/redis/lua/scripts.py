"""The Lua scripts behind every state change of the Redis queue.

Each script runs atomically inside Redis, so concurrent agents and API replicas can never both
take a request, lose one, or record two results. Scripts touch only the keys they are given
(KEYS); the key layout and the record fields are described in qlm/queue/README.md. Numbers
(times, leases) arrive as strings written by Python's repr(float) and are stored unchanged;
times always come from the caller, never from the Redis server's clock. Which source states
may reach a terminal state is decided in Python from qlm.types.TRANSITIONS and passed in, so
the transition table has one home.

Record hash fields: req (request JSON without its state), state, seq (arrival order), ten
(tenant), inst (holder), lease (expiry, caller's clock), disp (dispatches), evic (evictions),
group, wait, result (result JSON), first (the first token's time, kept from the first attempt
that made one).

The `tenants` hash counts QUEUED requests per tenant (a tenant at 0 is deleted): every script
that moves a request into or out of QUEUED updates it in the same step, so ENQUEUE can bound
a tenant's queue atomically. Records written before tenants were counted have no `ten` and
are not counted.
"""

from __future__ import annotations

# Shared helpers, prepended to the scripts that use them.
_HELPERS = """
local function move(counts, from, to, n)
  redis.call('HINCRBY', counts, from, -n)
  redis.call('HINCRBY', counts, to, n)
end
local function notify(changes, kind)
  redis.call('XADD', changes, 'MAXLEN', '~', '1000', '*', 'k', kind)
end
local function in_flight(state)
  return state == 'dispatched' or state == 'running'
end
local function count_tenant(tenants, tenant, n)
  if not tenant then return end
  if redis.call('HINCRBY', tenants, tenant, n) <= 0 then redis.call('HDEL', tenants, tenant) end
end
local function append(rec, stream, fields, last)
  local prev = last or '0-0'  -- the record's 'sl' field, read by the caller with its others
  local id = redis.call('XADD', stream, '*', unpack(fields))
  redis.call('HSET', rec, 'sl', id)
  local carried = {prev, id}
  for _, v in ipairs(fields) do carried[#carried + 1] = v end
  redis.call('PUBLISH', stream, cjson.encode(carried))
end
"""

# KEYS: record, stream, queued, seq, counts, changes, tenants, listed, listed by tenant
# ARGV: id, request JSON, queued limit for the request's class (-1: unbounded), tenant,
#       queued limit per tenant (-1: unbounded), ids each listing index keeps
# Returns 1, or -1 when the id exists, -2 when the queue is full for the request's class,
# -3 when the tenant's queue is full.
ENQUEUE = (
    _HELPERS
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then return -1 end
local max = tonumber(ARGV[3])
if max >= 0 and redis.call('ZCARD', KEYS[3]) >= max then return -2 end
local tenant_max = tonumber(ARGV[5])
if tenant_max >= 0 and tonumber(redis.call('HGET', KEYS[7], ARGV[4]) or '0') >= tenant_max then
  return -3
end
local seq = redis.call('INCR', KEYS[4])
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'req', ARGV[2], 'state', 'queued', 'seq', seq, 'ten', ARGV[4],
  'disp', 0, 'evic', 0)
redis.call('ZADD', KEYS[3], seq, ARGV[1])
redis.call('HINCRBY', KEYS[5], 'queued', 1)
count_tenant(KEYS[7], ARGV[4], 1)
local keep = tonumber(ARGV[6])
for i = 8, 9 do
  redis.call('ZADD', KEYS[i], seq, ARGV[1])
  redis.call('ZREMRANGEBYRANK', KEYS[i], 0, -keep - 1)
end
notify(KEYS[6], 'enqueue')
return 1
"""
)

# KEYS: queued, leases, counts, tenants, record...
# ARGV: instance, lease expiry, id... (parallel to the records)
# Returns id, request JSON, dispatch count (this pull included), an earlier attempt's first
# token time ('' for none), id, ... for the requests moved to DISPATCHED.
PULL = (
    _HELPERS
    + """
local moved = {}
for i = 5, #KEYS do
  local id = ARGV[i - 2]
  local f = redis.call('HMGET', KEYS[i], 'state', 'req', 'ten', 'first')
  if f[1] == 'queued' then
    redis.call('HSET', KEYS[i], 'state', 'dispatched', 'inst', ARGV[1], 'lease', ARGV[2])
    local disp = redis.call('HINCRBY', KEYS[i], 'disp', 1)
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZADD', KEYS[2], ARGV[2], id)
    count_tenant(KEYS[4], f[3], -1)
    moved[#moved + 1] = id
    moved[#moved + 1] = f[2]
    moved[#moved + 1] = disp
    moved[#moved + 1] = f[4] or ''
  end
end
if #moved > 0 then move(KEYS[3], 'queued', 'dispatched', #moved / 4) end
return moved
"""
)

# KEYS: record, counts
# ARGV: instance, first token time ('' for none: kept unless an earlier attempt's is there)
# Returns 1 when the instance holds the request (now RUNNING), else 0.
MARK_RUNNING = (
    _HELPERS
    + """
local f = redis.call('HMGET', KEYS[1], 'state', 'inst')
if f[2] ~= ARGV[1] or not in_flight(f[1]) then return 0 end
if f[1] == 'dispatched' then
  redis.call('HSET', KEYS[1], 'state', 'running')
  move(KEYS[2], 'dispatched', 'running', 1)
end
if ARGV[2] ~= '' then redis.call('HSETNX', KEYS[1], 'first', ARGV[2]) end
return 1
"""
)

# KEYS: leases, record...
# ARGV: instance, lease expiry, id...
# Returns the ids whose lease the instance does not hold (lost: requeued or ended).
RENEW = (
    _HELPERS
    + """
local lost = {}
for i = 2, #KEYS do
  local f = redis.call('HMGET', KEYS[i], 'state', 'inst')
  if f[2] == ARGV[1] and in_flight(f[1]) then
    redis.call('HSET', KEYS[i], 'lease', ARGV[2])
    redis.call('ZADD', KEYS[1], ARGV[2], ARGV[i + 1])
  else
    table.insert(lost, ARGV[i + 1])
  end
end
return lost
"""
)

# Back to QUEUED, at the request's original place in arrival order, with a REQUEUED event.
# KEYS: queued, leases, counts, changes, tenants, then record, stream for each request
# ARGV: mode ('holder': held by ARGV[2]; 'lease': lease ran out by ARGV[4]), instance,
#       evicted ('1' counts an eviction), now, id...
# Returns the ids moved.
REQUEUE = (
    _HELPERS
    + """
local moved = {}
local n = (#KEYS - 5) / 2
for j = 1, n do
  local rec, stream, id = KEYS[4 + 2 * j], KEYS[5 + 2 * j], ARGV[4 + j]
  local f = redis.call('HMGET', rec, 'state', 'inst', 'lease', 'seq', 'disp', 'ten', 'sl')
  local ok = in_flight(f[1])
  if ARGV[1] == 'holder' then
    ok = ok and f[2] == ARGV[2]
  else
    ok = ok and f[3] and tonumber(f[3]) <= tonumber(ARGV[4])
  end
  if ok then
    redis.call('HSET', rec, 'state', 'queued')
    redis.call('HDEL', rec, 'inst', 'lease')
    if ARGV[3] == '1' then redis.call('HINCRBY', rec, 'evic', 1) end
    redis.call('ZREM', KEYS[2], id)
    redis.call('ZADD', KEYS[1], f[4], id)
    move(KEYS[3], f[1], 'queued', 1)
    count_tenant(KEYS[5], f[6], 1)
    append(rec, stream, {'k', 'requeued', 'a', f[5], 't', ARGV[4]}, f[7])
    moved[#moved + 1] = id
  elseif ARGV[1] == 'lease' and not in_flight(f[1]) then
    redis.call('ZREM', KEYS[2], id)
  end
end
if #moved > 0 then notify(KEYS[4], 'requeue') end
return moved
"""
)

# The end of a request: COMPLETED or FAILED by its holder, or CANCELLED by anyone.
# KEYS: record, stream, queued, leases, counts, changes, tenants
# ARGV: id, mode ('holder' or 'any'), instance ('' for none), new state,
#       allowed source states (' queued running ' etc.), result JSON, event time,
#       TTL of the finished record and stream in ms (0: keep)
# Returns 1 when recorded, else 0.
FINISH = (
    _HELPERS
    + """
local f = redis.call('HMGET', KEYS[1], 'state', 'inst', 'disp', 'ten', 'sl')
local state = f[1]
if not state then return 0 end
if ARGV[2] == 'holder' and (f[2] or '') ~= ARGV[3] then return 0 end
if not string.find(ARGV[5], ' ' .. state .. ' ', 1, true) then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[4], 'result', ARGV[6])
redis.call('HDEL', KEYS[1], 'inst', 'lease')
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
move(KEYS[5], state, ARGV[4], 1)
if state == 'queued' then count_tenant(KEYS[7], f[4], -1) end
append(KEYS[1], KEYS[2], {'k', 'done', 'a', f[3], 't', ARGV[7], 'r', ARGV[6]}, f[5])
local ttl = tonumber(ARGV[8])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[2], ttl)
end
notify(KEYS[6], 'finish')
return 1
"""
)

# Every append to a request's stream (`append`: EMIT, REQUEUE, FINISH) is also PUBLISHed on a
# channel named like the stream, carrying the entry: a JSON array of the stream's previous
# entry id (kept in the record's `sl` field; '0-0' for the first), the new entry's id, then its
# fields. Readers (qlm/queue/redis/pokes.py) hold one pattern subscription per process instead
# of one blocking XREAD connection per open stream, and a reader whose last entry is the
# carried one's previous takes it from the message without a read (qlm/queue/redis/streams.py).
# One call appends a whole round of events (an agent's token chunks of one engine step): one
# command to pack, send and parse, not one per stream.
# KEYS: record, stream, per event
# ARGV: kind, attempt, time, text, tokens, offset, extras JSON ('' for none), per event
# Appends each event unless its request is unknown or finished. Returns how many it appended.
EMIT = (
    _HELPERS
    + """
local appended = 0
for i = 1, #KEYS, 2 do
  local f = redis.call('HMGET', KEYS[i], 'state', 'sl')
  local state = f[1]
  if state and state ~= 'completed' and state ~= 'cancelled' and state ~= 'failed' then
    local a = (i - 1) / 2 * 7
    local fields = {'k', ARGV[a + 1], 'a', ARGV[a + 2], 't', ARGV[a + 3], 'x', ARGV[a + 4],
                    'n', ARGV[a + 5], 'o', ARGV[a + 6]}
    if ARGV[a + 7] ~= '' then
      table.insert(fields, 'e')
      table.insert(fields, ARGV[a + 7])
    end
    append(KEYS[i], KEYS[i + 1], fields, f[2])
    appended = appended + 1
  end
end
return appended
"""
)

# KEYS: record...
# ARGV: group, predicted wait ('' for none), per record
ANNOTATE = """
for i = 1, #KEYS do
  if redis.call('HGET', KEYS[i], 'state') == 'queued' then
    redis.call('HSET', KEYS[i], 'group', ARGV[2 * i - 1])
    if ARGV[2 * i] == '' then
      redis.call('HDEL', KEYS[i], 'wait')
    else
      redis.call('HSET', KEYS[i], 'wait', ARGV[2 * i])
    end
  end
end
return #KEYS
"""

# KEYS: epoch counter, plan hash, plan-change stream
# ARGV: plan JSON
# Returns the new epoch. The stream (a few entries) wakes agents blocked on it.
PUBLISH_PLAN = """
local epoch = redis.call('INCR', KEYS[1])
redis.call('HSET', KEYS[2], 'epoch', epoch, 'json', ARGV[1])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', 16, '*', 'e', epoch)
return epoch
"""

# Compare-and-renew of the leader lease (taken with SET NX PX).
# KEYS: leader; ARGV: node id, lease in ms. Returns 1 when the node holds the lease.
RENEW_LEAD = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# A read: the requests among KEYS that are QUEUED, as one JSON array (one reply to parse, not
# one per request). `queued()` calls it on chunks of the `queued` index, so no single call
# holds Redis for long.
# KEYS: record...
QUEUED_REQUESTS = """
local out = {}
for i = 1, #KEYS do
  local f = redis.call('HMGET', KEYS[i], 'state', 'req')
  if f[1] == 'queued' then out[#out + 1] = f[2] end
end
return '[' .. table.concat(out, ',') .. ']'
"""
