-- round_robin: each stage's requests go to the healthy instances in turn.
-- The default policy. Each worker thread keeps its own rotation; with
-- several workers the spread is still even on average.
local turn = { encode = 0, prefill = 0, decode = 0 }

return {
  pick = function(ctx, instances)
    local n = #instances
    local start = turn[ctx.stage]
    turn[ctx.stage] = (start + 1) % n
    -- Skip unhealthy instances without disturbing the rotation.
    for k = 0, n - 1 do
      local inst = instances[(start + k) % n + 1]
      if inst.healthy then return inst end
    end
    return nil -- none healthy: decline, the gateway falls back
  end,
}
