-- least_load: the healthy instance with the fewest requests.
--
-- An instance's load is the requests this gateway has in flight on it
-- (exact, instant) plus, when its metrics are fresh, the load others put on
-- its engine as of the last scrape (running + waiting minus our own
-- in-flight then: other gateways' requests). Ties are broken by a rotating
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
--       local l = inst.in_flight
--       if inst.has_metrics then l = l + inst.other_load end
--       if l < best_load then best, best_load = inst, l end
--     end
--   end
--   return best
-- Where each stage's tie-breaking scan starts; per stage, or a request's
-- prefill pick would always move the decode rotation by the same step.
local turns = { encode = 0, prefill = 0, decode = 0 }

return {
  pick = function(ctx, instances)
    local turn = turns[ctx.stage] % #instances + 1
    turns[ctx.stage] = turn
    return (pdgate.least_loaded(turn))
  end,
}
