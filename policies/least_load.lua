-- least_load: the healthy instance with the fewest requests.
--
-- An instance's load is the larger of the requests this gateway has in
-- flight on it (exact, instant) and what its engine reports as running
-- plus waiting (includes other gateways' requests, but up to a scrape
-- interval old). Ties are broken by a rotating start, so equal instances
-- share the traffic instead of the first one taking it all.
local turn = 0

local function load_of(inst)
  local l = inst.in_flight
  if inst.has_metrics then
    local engine = inst.running + inst.waiting
    if engine > l then l = engine end
  end
  return l
end

return {
  pick = function(ctx, instances)
    local n = #instances
    turn = turn % n + 1
    local best, best_load = nil, math.huge
    -- Two loops instead of a modulo per step: this runs interpreted.
    for i = turn, n do
      local inst = instances[i]
      if inst.healthy then
        local l = load_of(inst)
        if l < best_load then best, best_load = inst, l end
      end
    end
    for i = 1, turn - 1 do
      local inst = instances[i]
      if inst.healthy then
        local l = load_of(inst)
        if l < best_load then best, best_load = inst, l end
      end
    end
    return best
  end,
}
