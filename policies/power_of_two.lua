-- power_of_two: sample two healthy instances at random and take the less
-- loaded one ("the power of two choices"). Nearly as good as least_load
-- at spreading load, without scanning every instance, and less prone to
-- herding when many gateways act on the same stale numbers.
local random = math.random
math.randomseed(pdgate.now_ms() * 1000 % 2147483647)

-- Load as pdgate.least_loaded counts it (docs/policies.md): live
-- in-flight plus, when the engine's metrics are fresh, others' load.
local load_of = pdgate.load

return {
  pick = function(ctx, instances)
    local n = #instances
    if n == 1 then
      if instances[1].healthy then return instances[1] end
      return nil
    end
    -- Two distinct positions: the second is offset from the first by 1..n-1.
    local i = random(n)
    local a = instances[i]
    local b = instances[(i - 1 + random(n - 1)) % n + 1]
    if not (a.healthy and b.healthy) then
      -- A sample is unhealthy: take the least loaded healthy instance.
      local best, best_load = nil, math.huge
      for k = 1, n do
        local inst = instances[k]
        if inst.healthy and load_of(inst) < best_load then best, best_load = inst, load_of(inst) end
      end
      if a.healthy and load_of(a) <= best_load then return a end
      if b.healthy and load_of(b) <= best_load then return b end
      return best
    end
    if load_of(b) < load_of(a) then return b end
    return a
  end,
}
