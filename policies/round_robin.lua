-- round_robin: each stage's requests go to the healthy instances in turn.
-- The default policy. The rotation is one counter per stage in the store
-- shared by all workers, so the spread stays even however the kernel
-- spreads client connections over worker threads.
local keys = { encode = "round_robin:encode", prefill = "round_robin:prefill",
               decode = "round_robin:decode" }

return {
  pick = function(ctx, instances)
    local n = #instances
    local turn = pdgate.kv_incr(keys[ctx.stage]) or 0
    local start = turn % n
    -- Skip unhealthy instances without disturbing the rotation.
    for k = 0, n - 1 do
      local inst = instances[(start + k) % n + 1]
      if inst.healthy then return inst end
    end
    return nil -- none healthy: decline, the gateway falls back
  end,
}
