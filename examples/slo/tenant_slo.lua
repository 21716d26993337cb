-- tenant_slo.lua: a tenant-aware SLO policy, built step by step in
-- docs/writing-a-policy.md. Tenants are API keys (--api-keys keys.yaml);
-- a key's `tier` label (gold or standard) names the decode instances
-- that serve it, labelled the same in pdgate.yaml.

-- Step 1: settings.
local LIMIT, WINDOW = 5, 10   -- requests per tenant per WINDOW seconds
local SHORT_TOKENS = 256      -- shorter prompts go in one hop
local LOAD_GUARD = 2          -- leave a prefix's home above 2x the least load

local function tier_of(key)
  return key and key.labels.tier or "standard"
end

return {
  -- Step 5: a tenant's rule must hold even when the policy cannot:
  -- a failure or a nil answers 503, never round-robin onto gold.
  fail_closed = true,

  on_request = function(req)
    local tenant = req.key and req.key.name or "anonymous"
    -- Step 2: at most LIMIT requests per tenant in WINDOW seconds, across
    -- every replica sharing --redis; past it, 429 with Retry-After.
    req:rate_limit("slo:" .. tenant, LIMIT, WINDOW,
                   "tenant " .. tenant .. " is over " .. LIMIT .. " requests in " .. WINDOW .. " s")
    -- Step 3: the tier, worked out once for every pick of the request.
    req.vars.tier = tier_of(req.key)
    -- Step 4: short prompts skip the prefill stage.
    if req.prompt_tokens < SHORT_TOKENS then
      req:set_path("one_hop")
    end
    pdgate.log("debug", tenant .. ": tier " .. req.vars.tier .. ", "
                          .. (req.prompt_tokens < SHORT_TOKENS and "one hop" or "prefill then decode"))
  end,

  pick = function(ctx, instances)
    if ctx.stage ~= "decode" then
      -- Step 6: prefill where the prompt's prefix went before, unless that
      -- instance carries more than LOAD_GUARD times the least load.
      local least, least_load = pdgate.least_loaded()
      if least == nil then return nil end -- none healthy
      local matches = pdgate.prefix_matches()
      local home, home_blocks = nil, 0
      for i, blocks in pairs(matches) do
        if blocks > home_blocks and instances[i].healthy then
          home, home_blocks = instances[i], blocks
        end
      end
      if home and pdgate.load(home) <= LOAD_GUARD * least_load + 1 then
        return home
      end
      return least
    end
    -- Step 3: decode on the tenant's tier; step 7: a retry stays in the
    -- tier of the instance that failed.
    local tier = ctx.vars.tier or tier_of(ctx.key)
    if ctx.failed then
      tier = ctx.failed.labels.tier
      pdgate.log("debug", "retry " .. ctx.attempt .. " after " .. ctx.failed.kind .. " in tier " .. tier)
    end
    local best, best_load = nil, math.huge
    for _, inst in ipairs(instances) do
      if inst.healthy and inst.labels.tier == tier then
        local load = pdgate.load(inst)
        if load < best_load then
          best, best_load = inst, load
        end
      end
    end
    return best -- nil: no instance of the tier left, 503 (fail-closed)
  end,
}
