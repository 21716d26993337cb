-- cache_aware: send a request where it is expected to get its first token
-- soonest, weighing the prefix an instance already caches against the
-- prefill work queued on it.
--
-- For a candidate i the expected time to first token is
--
--   cost_i * (own_i + load_i * work_i)
--
-- own_i:  the blocks the prompt would compute there (its blocks minus the
--         leading blocks pdgate.prefix_matches() says were routed there),
--         plus one for the fixed cost every request has;
-- load_i: requests this gateway has queued or running there (in_flight:
--         exact and live). Other gateways' requests, known only from the
--         engine's metrics scraped up to a second ago, are left out here:
--         prefill queues turn over in a fraction of that, so a scraped burst
--         that had long drained kept moving prompts off the engine caching
--         them (with 4 replicas sharing the KV-location index that cost
--         0.07-0.11 of the hit rate and 10-25% of TTFT; bench/README.md);
-- work_i: the mean `own` of the requests sent there (an EWMA), i.e. the
--         prefill work one queued request stands for;
-- cost_i: milliseconds per block on that instance, learned in on_complete
--         from each prefill's ttft_ms (its answer's arrival) divided by the
--         work it waited for (its own plus what was queued ahead when it
--         was picked).
--
-- Queued prefills are counted one after another: an engine's prefill
-- throughput is bound by tokens, so work queued ahead delays a prompt by
-- about its size. Unlike prefix_affinity's fixed guard (8 requests and
-- 1.5x), a long cached prefix is worth a longer queue than a short one,
-- and a queue of cache hits costs less than one of cold prompts.
--
-- Candidates with no match all have the same `own`, so only the least
-- loaded of them is weighed (pdgate.least_loaded, in C++, which does count
-- other gateways' load): the Lua loop visits the matching instances only,
-- as prefix_affinity's does.
--
-- Decode after a prefill (ctx.prefill set) pulls the KV from the prefill,
-- so the prefix cache does not matter there: least loaded. One-hop decode
-- (no prefill stage) is routed like a prefill.
local ALPHA = 0.1 -- weight of a new sample in the EWMAs
local MIN_COST = 1e-6 -- ms per block; keeps estimates ordered when timings read 0
local MAX_PENDING = 4096 -- picks awaiting on_complete, per generation (two kept)
local MAX_STATS = 4096 -- instances with learned numbers

-- Where each stage's tie-breaking scan starts; per stage, or a request's
-- prefill pick would always move the decode rotation by the same step.
local turns = { encode = 0, prefill = 0, decode = 0 }

-- [instance id] = { cost = ms per block (nil until learned), work = blocks }
local stats, nstats = {}, 0
-- Fleet-wide numbers: the prior for instances not yet learned.
local fleet = { cost = nil, work = nil }

-- [request id] = { id = instance id, work = blocks waited for }. Two
-- generations: a request whose on_complete never comes ages out.
local pending, old_pending, npending = {}, {}, 0

local function load_of(inst)
  return inst.in_flight
end

local function stat(id)
  local s = stats[id]
  if s == nil then
    if nstats >= MAX_STATS then
      stats, nstats = {}, 0
    end
    s = {}
    stats[id] = s
    nstats = nstats + 1
  end
  return s
end

local function ewma(old, sample)
  if old == nil then return sample end
  return old + ALPHA * (sample - old)
end

local function estimate(inst, own, default_work)
  local s = stats[inst.id]
  local cost = (s and s.cost) or fleet.cost or 1
  local work = (s and s.work) or fleet.work or default_work
  local load = load_of(inst)
  return cost * (own + load * work), load * work
end

return {
  pick = function(ctx, instances)
    local turn = turns[ctx.stage] % #instances + 1
    turns[ctx.stage] = turn
    local least = pdgate.least_loaded(turn)
    if least == nil then return nil end
    if ctx.stage == "decode" and ctx.prefill ~= nil then return least end

    local matches, blocks = pdgate.prefix_matches()
    local cold = blocks + 1
    local best = least
    local best_own = cold - (matches[least.index] or 0)
    local best_est, best_ahead = estimate(least, best_own, cold)
    for i, m in pairs(matches) do
      local inst = instances[i]
      if inst.healthy and inst ~= least then
        local own = cold - m
        local est, ahead = estimate(inst, own, cold)
        if est < best_est or (est == best_est and own < best_own) then
          best, best_own, best_est, best_ahead = inst, own, est, ahead
        end
      end
    end

    local s = stat(best.id)
    s.work = ewma(s.work, best_own)
    fleet.work = ewma(fleet.work, best_own)
    if ctx.request_id and ctx.request_id ~= "" then
      if npending >= MAX_PENDING then
        old_pending, pending, npending = pending, {}, 0
      end
      pending[ctx.request_id] = { id = best.id, work = best_own + best_ahead }
      npending = npending + 1
    end
    return best
  end,

  on_complete = function(ctx, instance, outcome)
    -- A decode after a prefill shares the request id of a pending prefill pick.
    if ctx.stage == "decode" and ctx.prefill ~= nil then return end
    local rid = ctx.request_id
    local p = pending[rid]
    if p ~= nil then
      pending[rid] = nil
      npending = npending - 1
    else
      p = old_pending[rid]
      if p == nil then return end
      old_pending[rid] = nil
    end
    if not outcome.ok or p.id ~= instance.id then return end
    local sample = math.max(outcome.ttft_ms / p.work, MIN_COST)
    local s = stat(instance.id)
    s.cost = ewma(s.cost, sample)
    fleet.cost = ewma(fleet.cost, sample)
  end,
}
