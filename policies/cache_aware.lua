-- cache_aware: send a request where it is expected to get its first token
-- soonest, weighing the prefix each instance already caches against the
-- prefill work queued on it by every gateway replica.
--
-- For each candidate, pdgate.predicted_ttft(inst) is
--
--   (queued tokens + fixed cost x requests ahead + uncached tokens
--    + fixed cost) x ms per token
--
-- queued tokens: the uncached prompt tokens every replica has sent there
--   and not yet seen computed (with --redis, shared within milliseconds);
-- uncached tokens: this prompt less the longest cached prefix the lookups
--   found there: the engine's own KV events where it has an exact feed
--   (pdgate.cached_tokens), else where prompts were routed
--   (pdgate.prefix_matches);
-- ms per token: learnt by the gateway from each engine's completed
--   prefills (time / tokens waited for); engines not learnt yet take the
--   mean of those that are.
--
-- The candidate with the lowest score wins: the prediction less what the
-- cache saves there (leaving a cache costs the cluster that compute again,
-- and delays what queues behind it: LEAVE_COST). Unlike prefix_affinity,
-- which keeps the longest match unless its queue outweighs a cold start,
-- a partial match elsewhere may win, and a long cached prefix is worth a
-- longer queue than a short one.
-- Candidates without a match all compute the whole prompt: only the best
-- of them (pdgate.least_cost, in C++) is weighed against the matches.
--
-- Behind one load balancer, a cold start, a smaller cache than the
-- largest, or a choice caching less than MIN_SHARE of the prompt (a
-- shared system prompt, say, before a new conversation) is rechecked
-- (pdgate.RECHECK) once the replicas ahead of this one have picked: two
-- replicas starting the same new prefix at once would start it on two
-- engines.
--
-- Decode after a prefill (ctx.prefill set) pulls the KV from the prefill,
-- so the prefix cache does not matter there: least loaded. One-hop decode
-- (no prefill stage) is routed like a prefill.
-- What leaving a cache costs, in multiples of what it saves: 1 counts
-- only this request's time; the cluster pays too (the cached part is
-- computed again, what queues behind it on the engine it goes to waits for
-- that, and the prefix now takes room in two caches). Higher keeps
-- prefixes home longer: more hits, longer queues in bursts. 3 did best on
-- the benchmark's traces (bench/README.md, "Routing quality"); 1 lost a
-- fifth of the hits on a conversation trace and bought no latency.
local LEAVE_COST = 3
-- A choice caching less of the prompt than this starts most of it cold:
-- rechecked like a cold start (prefix_affinity's MIN_MATCH, kv_aware's
-- MIN_SHARE). Without it, four replicas alternating kept 0.93-0.97x the
-- hits of all traffic through one on a conversation trace, where most
-- prompts share a block or two with many others (bench/README.md,
-- "Rechecked picks, measured in repeats").
local MIN_SHARE = 0.1

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
    local best, best_score = pdgate.least_cost(turn)
    if best == nil then return nil end
    local matches, blocks = pdgate.prefix_matches()
    local exact, tokens = pdgate.cached_tokens()
    -- What the chosen candidate's cache saves, and the most any saves.
    local best_saved, most_saved = 0, 0
    -- The share of the prompt the chosen candidate caches.
    local best_share = 0
    local function consider(i)
      local inst = instances[i]
      if not inst.healthy then return end
      -- An engine with an exact feed is judged by it alone.
      local cached = exact and exact[i]
      local ms, saved = pdgate.predicted_ttft(inst, cached)
      if saved > most_saved then most_saved = saved end
      -- What the cache saves there counts LEAVE_COST - 1 times beyond this
      -- request's own wait: the cluster computes it again wherever else
      -- the request goes, and whatever queues behind it there waits too.
      local score = ms - (LEAVE_COST - 1) * saved
      if score < best_score then
        best, best_score, best_saved = inst, score, saved
        -- The share of the prompt cached there, by the same lookup.
        if cached ~= nil then
          best_share = (tokens ~= nil and tokens > 0) and cached / tokens or 0
        else
          best_share = (blocks ~= nil and blocks > 0) and (matches[i] or 0) / blocks or 0
        end
      end
    end
    for i in pairs(matches) do consider(i) end
    if exact ~= nil then
      for i in pairs(exact) do
        if matches[i] == nil then consider(i) end
      end
    end
    -- A cold start (or nearly: less than MIN_SHARE cached), or a smaller
    -- cache than the largest, chosen while another replica picks for the
    -- same prefix may miss its pick: wait for the replicas ahead of this
    -- one and look again (ctx.recheck_ms is 0 when there is nothing to
    -- wait for, and on that second look).
    local cold = most_saved == 0 or best_share < MIN_SHARE
    if (cold or best_saved < most_saved) and ctx.recheck_ms > 0 then
      return pdgate.RECHECK
    end
    return best
  end,
}
