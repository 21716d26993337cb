-- prefix_affinity: send a request where its prompt's prefix was sent
-- before, so the engine's prefix cache already holds those KV blocks --
-- the cache-aware scheme of SGLang's router, with a guard that weighs the
-- cache against the queue in front of it.
--
-- The gateway keeps an approximate index of the prefix blocks it (and,
-- with --redis, every replica) routed to each instance (bounded, entries
-- expire after 10 minutes); pdgate.prefix_matches() answers, for this
-- request, how many leading blocks each instance received recently. The
-- longest match wins, unless the wait there costs more than leaving the
-- cache: pdgate.predicted_ttft (the prompt tokens every replica has queued
-- on that engine, then this prompt's uncached ones, at the engine's learnt
-- cost per token) against pdgate.least_cost (the same for the whole prompt
-- where it would start soonest), plus what leaving costs the cluster (the
-- cached part computed again, which delays whatever queues behind it
-- there). So a hot prefix spreads to a second engine when its home's queue
-- outgrows a few times the prefix, and comes back when the queue drains.
-- A match shorter than MIN_MATCH of the prompt's blocks counts as none.
-- Whichever instance is chosen is recorded as holding this prompt's
-- blocks. Behind one load balancer, a cold start or a cache left is
-- rechecked (pdgate.RECHECK) once the replicas ahead of this one have
-- picked: two replicas starting the same new prefix at once would start
-- it on two engines.
--
-- Decode after a prefill pulls the KV from the prefill: least loaded.
local MIN_MATCH = 0.1
-- What leaving a cache costs, in multiples of what it saves: 1 counts
-- only this request's time; the cluster pays too (the cached part is
-- computed again, what queues behind it on the engine it goes to waits for
-- that, and the prefix now takes room in two caches). Higher keeps
-- prefixes home longer: more hits, longer queues in bursts. 3 did best on
-- the benchmark's traces (bench/README.md, "Routing quality"); 1 lost a
-- fifth of the hits on a conversation trace and bought no latency.
local LEAVE_COST = 3

-- Where each stage's tie-breaking scan starts: per stage (or a request's
-- prefill pick would always move the decode rotation by the same step),
-- and from a point of this worker's own, the clock's microseconds when the
-- script loaded: replicas (and workers) behind one balancer, each taking
-- every Nth request, would otherwise move in lockstep and send their tied
-- picks to the same instance.
local origin = math.floor(pdgate.now_ms() * 1000) % 65521
local turns = { encode = origin, prefill = origin, decode = origin }

return {
  pick = function(ctx, instances)
    local turn = turns[ctx.stage] % #instances + 1
    turns[ctx.stage] = turn
    if ctx.stage == "decode" and ctx.prefill ~= nil then
      return pdgate.least_loaded(turn)
    end
    local cold, cold_ms = pdgate.least_cost(turn)
    if cold == nil then return nil end
    local matches, blocks = pdgate.prefix_matches()
    local best, best_blocks, best_ms = nil, 0, 0
    for i, m in pairs(matches) do
      local inst = instances[i]
      if inst.healthy then
        local ms = pdgate.predicted_ttft(inst)
        if m > best_blocks or (m == best_blocks and ms < best_ms) then
          best, best_blocks, best_ms = inst, m, ms
        end
      end
    end
    -- A cold start, or leaving a cache, made while another replica picks
    -- for the same prefix may miss its pick: wait for the replicas ahead
    -- of this one and look again (ctx.recheck_ms is 0 when there is
    -- nothing to wait for, and on that second look).
    if best == nil or best_blocks < MIN_MATCH * blocks then
      if ctx.recheck_ms > 0 then return pdgate.RECHECK end
      return cold
    end
    -- The cache is left only when waiting for it costs more than leaving
    -- it: the wait beyond the soonest cold start against LEAVE_COST times
    -- what the cache saves, less the once this request pays in either case.
    local _, saved = pdgate.predicted_ttft(best)
    if best_ms - cold_ms > (LEAVE_COST - 1) * saved then
      if ctx.recheck_ms > 0 then return pdgate.RECHECK end
      return cold
    end
    return best
  end,
}
