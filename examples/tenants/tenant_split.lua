-- tenant_split.lua: each tenant's requests run on its own tier's decode
-- instances (docs/policies.md, "Worked example: a tenant split").
--
-- A tenant is the client's API key (pdgate --api-keys keys.yaml); the
-- key's `tier` label (gold or standard) names the decode instances that
-- may serve it, labelled the same in the config file (pdgate.yaml).
-- A key without a known tier is refused with 429 before anything is
-- routed. The policy is fail-closed: if it fails, or a tier has no
-- healthy instance, the request is answered 503 instead of being routed
-- round-robin over every instance, which would put a standard tenant on
-- a gold instance.
local TIERS = { gold = true, standard = true }

-- Where the scan for the least loaded instance starts, moved on each
-- pick so that equally loaded instances take turns.
local turn = 0

local function tier_of(key)
  return key and key.labels.tier
end

return {
  fail_closed = true,

  on_request = function(req)
    local tier = tier_of(req.key)
    if not TIERS[tier] then
      pdgate.count("unknown_tenant")
      return 429, "this API key belongs to no tenant tier"
    end
    pdgate.count("tier_" .. tier)
    -- The engines see the tier; standard tenants get at most 512 tokens
    -- and queue behind gold ones under vLLM's priority scheduling
    -- (lower runs first).
    req:set_header("x-tenant-tier", tier)
    if tier == "standard" then
      req:cap_max_tokens(512)
      req:set_priority(10)
    end
  end,

  pick = function(ctx, instances)
    if ctx.stage ~= "decode" then
      return pdgate.least_loaded() -- prefill (and encode) are shared
    end
    local tier = tier_of(ctx.key)
    local best, best_load = nil, math.huge
    turn = turn % #instances + 1
    for k = 0, #instances - 1 do
      local inst = instances[(turn + k - 1) % #instances + 1]
      if inst.healthy and inst.labels.tier == tier then
        local load = pdgate.load(inst)
        if load < best_load then
          best, best_load = inst, load
        end
      end
    end
    return best -- nil: the tier has no healthy instance, 503 (fail-closed)
  end,
}
