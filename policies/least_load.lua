-- least_load: the healthy instance with the fewest requests.
--
-- An instance's load is the requests every gateway replica has in flight
-- on it (this one's exact and instant, the others' from their load
-- reports, milliseconds old) plus, when its metrics are fresh, what its
-- engine holds beyond them as of the last scrape (running + waiting minus
-- the replicas' in-flight then). Ties are broken by a rotating
-- start, so equal instances share the traffic instead of the first one
-- taking it all.
--
-- pdgate.least_loaded(start) is this loop done in C++ (a 256-instance scan
-- costs under 1 us there, ~5 us interpreted):
--
--   local best, best_load = nil, math.huge
--   for k = 0, #instances - 1 do
--     local inst = instances[(start - 1 + k) % #instances + 1]
--     if inst.healthy then
--       local l = inst.cluster_in_flight
--       if inst.has_metrics then l = l + inst.other_load end
--       if l < best_load then best, best_load = inst, l end
--     end
--   end
--   return best
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
    return (pdgate.least_loaded(turn))
  end,
}
