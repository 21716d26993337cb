-- kv_aware: send a request to the instance whose engine really holds the
-- longest cached prefix of its prompt, known from the engines' own KV
-- cache events (docs/kv-events.md), and fall back to what pdgate routed
-- (prefix_affinity's approximate index) for engines without an exact feed.
--
-- The approximate index remembers where prefixes were *sent*; it cannot
-- know what an engine evicted since, or what reached it from elsewhere
-- (another gateway, a client calling it directly, a KV pull). With small
-- caches that evict, prefix_affinity keeps sending prompts to engines that
-- no longer hold their blocks; the events say which ones still do.
--
-- For a candidate i its cached share of the prompt is
--   exact feed:   pdgate.cached_tokens()[i] / prompt tokens
--   otherwise:    pdgate.prefix_matches()[i] / prompt blocks
-- The largest share wins, unless waiting there costs more than leaving
-- the cache (prefix_affinity's guard: pdgate.predicted_ttft against
-- pdgate.least_cost, on the prompt tokens every replica has queued on each
-- engine, leaving counted at LEAVE_COST times what the cache saves); a
-- share under MIN_SHARE counts as none and the soonest start takes it.
-- prefix_matches() is always asked, so the approximate index keeps
-- learning for engines whose feed falls back. Behind one load balancer, a
-- cold start or a cache left is rechecked (pdgate.RECHECK) once the
-- replicas ahead of this one have picked, as in prefix_affinity.
--
-- Decode after a prefill pulls the KV from the prefill: least loaded.
local MIN_SHARE = 0.1
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
    local exact, tokens = pdgate.cached_tokens()
    local best, best_share, best_ms, best_saved = nil, 0, 0, 0
    local function consider(inst, share, cached)
      if not inst.healthy then return end
      local ms, saved = pdgate.predicted_ttft(inst, cached)
      if share > best_share or (share == best_share and ms < best_ms) then
        best, best_share, best_ms, best_saved = inst, share, ms, saved
      end
    end
    if exact ~= nil and tokens ~= nil and tokens > 0 then
      for i, n in pairs(exact) do
        consider(instances[i], n / tokens, n)
      end
    end
    if blocks ~= nil and blocks > 0 then
      for i, m in pairs(matches) do
        -- An instance with an exact feed is judged by it alone.
        if exact == nil or exact[i] == nil then
          consider(instances[i], m / blocks, nil)
        end
      end
    end
    -- prefix_affinity's rules: a cold start or a cache left is rechecked
    -- once the replicas ahead have picked (ctx.recheck_ms: 0 when there is
    -- nothing to wait for); leaving costs LEAVE_COST times what the cache
    -- saves.
    if best == nil or best_share < MIN_SHARE then
      if ctx.recheck_ms > 0 then return pdgate.RECHECK end
      return cold
    end
    if best_ms - cold_ms > (LEAVE_COST - 1) * best_saved then
      if ctx.recheck_ms > 0 then return pdgate.RECHECK end
      return cold
    end
    return best
  end,
}
