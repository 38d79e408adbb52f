-- Token buckets for tool calls, shared by every executor (see executor/ratelimit).
--
-- A bucket is a hash: tokens (may be fractional), ts (ms of the last refill),
-- slot (ms: the next wake time to hand to a caller that finds it empty),
-- blocked (ms: no token before this, after a provider's 429 Retry-After),
-- cool (ms: the rate stays lowered until then) and factor (by how much).
-- Time is Redis's own clock, the same for every executor.
--
-- take      KEYS: the buckets; ARGV: 'take', cost, then rate (tokens/s) and
--           burst of each key in order. Takes `cost` from every bucket or
--           from none. Returns {1, 0} when taken, else {0, wait_ms}: when to
--           try again. Callers that find a bucket empty get successive slots,
--           1/rate apart, so parked runs come back one token at a time
--           instead of all at once.
-- penalize  KEYS: one bucket; ARGV: 'penalize', retry_after_ms, factor,
--           cooldown_ms, rate, burst. The provider answered 429: empty the
--           bucket, give no token before retry_after, and multiply its rate
--           by factor (again at each 429, down to 1/16) until cooldown_ms
--           from now. Returns {0, wait_ms} for the refused caller.

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local MIN_FACTOR = 1 / 16

local function load(key, rate, burst)
    local f = redis.call('HMGET', key, 'tokens', 'ts', 'slot', 'blocked', 'cool', 'factor')
    local b = {
        key = key, rate = rate, burst = burst,
        tokens = tonumber(f[1]) or burst,
        ts = tonumber(f[2]) or now,
        slot = tonumber(f[3]) or 0,
        blocked = tonumber(f[4]) or 0,
        cool = tonumber(f[5]) or 0,
        factor = tonumber(f[6]) or 1,
    }
    if b.cool <= now then
        b.factor = 1
    end
    b.per_ms = rate * b.factor / 1000
    -- Nothing accrues while blocked: the first token after a 429 comes a full
    -- token's time after the block ends, not a burst at once.
    local since = math.max(b.ts, b.blocked)
    if now > since then
        b.tokens = math.min(burst, b.tokens + (now - since) * b.per_ms)
    end
    b.ts = math.max(now, b.ts)
    return b
end

local function save(b)
    redis.call('HSET', b.key, 'tokens', tostring(b.tokens), 'ts', tostring(b.ts),
        'slot', tostring(b.slot), 'blocked', tostring(b.blocked),
        'cool', tostring(b.cool), 'factor', tostring(b.factor))
    local keep = math.max(b.burst / b.per_ms, b.slot - now, b.blocked - now, b.cool - now)
    redis.call('PEXPIRE', b.key, math.ceil(keep) + 60000)
end

-- When `cost` tokens will be there (ms), the bucket's block included.
local function ready_at(b, cost)
    local from = math.max(now, b.blocked)
    return from + math.max(0, cost - b.tokens) / b.per_ms
end

local function short(b, cost)
    return b.blocked > now or b.tokens < cost
end

if ARGV[1] == 'take' then
    local cost = tonumber(ARGV[2])
    local buckets, ready = {}, true
    for i, key in ipairs(KEYS) do
        buckets[i] = load(key, tonumber(ARGV[1 + 2 * i]), tonumber(ARGV[2 + 2 * i]))
        if short(buckets[i], cost) then
            ready = false
        end
    end
    if ready then
        for _, b in ipairs(buckets) do
            b.tokens = b.tokens - cost
            save(b)
        end
        return {1, 0}
    end
    local wake = now
    for _, b in ipairs(buckets) do
        if short(b, cost) then
            b.slot = math.max(b.slot, ready_at(b, cost))
            wake = math.max(wake, b.slot)
            b.slot = b.slot + cost / b.per_ms
        end
        save(b)
    end
    return {0, math.ceil(wake - now)}
end

if ARGV[1] == 'penalize' then
    local retry_after, factor, cooldown = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
    local b = load(KEYS[1], tonumber(ARGV[5]), tonumber(ARGV[6]))
    b.factor = math.max(MIN_FACTOR, b.factor * factor)
    b.per_ms = b.rate * b.factor / 1000
    b.cool = now + cooldown
    b.blocked = math.max(b.blocked, now + retry_after)
    b.tokens = 0
    b.slot = math.max(b.slot, ready_at(b, 1))
    local wake = b.slot
    b.slot = b.slot + 1 / b.per_ms
    save(b)
    return {0, math.ceil(wake - now)}
end

return redis.error_reply('token_bucket.lua: unknown command ' .. tostring(ARGV[1]))
