-- conditional_pd: per request, whether the prefill hop is worth its cost
-- (docs/policies.md, "Conditional disaggregation").
--
-- The request hook sends a request one hop, to a decode instance that
-- prefills it locally, when its prompt is short (an estimate: 4 bytes of
-- prompt JSON per token) or when a decode instance already holds most of
-- it (pdgate.prefix_held: where this gateway recently sent the prompt's
-- leading blocks). Everything else goes prefill, then decode. The picks
-- follow the prompt's blocks: the instance holding the longest prefix,
-- unless it carries more than SLACK requests over the least loaded; so a
-- one-hop request lands where its prefix is, and every pick records
-- where the prompt went.
local SHORT_PROMPT_TOKENS = 256
local HELD_FRACTION = 0.75
local SLACK = 4

return {
  on_request = function(req)
    if req.prompt_tokens <= SHORT_PROMPT_TOKENS then
      req:set_path("one_hop")
      return
    end
    local held, blocks = pdgate.prefix_held("decode")
    if blocks > 0 and held >= HELD_FRACTION * blocks then
      req:set_path("one_hop")
    end
  end,

  pick = function(ctx, instances)
    local least, least_load = pdgate.least_loaded()
    if least == nil then return nil end
    local matches = pdgate.prefix_matches()
    local best, best_blocks = nil, 0
    for i, m in pairs(matches) do
      local inst = instances[i]
      if inst.healthy and m > best_blocks and pdgate.load(inst) <= least_load + SLACK then
        best, best_blocks = inst, m
      end
    end
    return best or least
  end,
}
