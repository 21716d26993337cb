-- conditional_pd: per request, whether the prefill hop is worth its cost
-- (docs/policies.md, "Conditional disaggregation").
--
-- The request hook sends a request one hop, to a decode instance that
-- prefills it locally, when its prompt is short (an estimate: 4 bytes of
-- prompt JSON per token) or when a decode instance already holds most of
-- it (pdgate.prefix_held: where this gateway recently sent the prompt's
-- leading blocks). Everything else goes prefill, then decode. The picks
-- follow the prompt's blocks: the instance where the prompt is predicted
-- to get its first token soonest (pdgate.predicted_ttft: the prompt tokens
-- every replica queued there, then this prompt's uncached ones, with the
-- engine's exact cached tokens where it sends KV events). So a one-hop
-- request lands where its prefix is unless the queue there costs more,
-- and every pick (a decode after a prefill too: it keeps the blocks it
-- pulled) records where the prompt went.
local SHORT_PROMPT_TOKENS = 256
local HELD_FRACTION = 0.75

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
    local cold, cold_ms = pdgate.least_cost()
    if cold == nil then return nil end
    local matches = pdgate.prefix_matches()
    local exact = pdgate.cached_tokens()
    local best, best_ms = nil, cold_ms
    for i in pairs(matches) do
      local inst = instances[i]
      if inst.healthy then
        -- The engine's own KV events where it has a feed, else where
        -- prompts were routed.
        local ms, saved = pdgate.predicted_ttft(inst, exact and exact[i])
        -- Leaving a cache costs three times what it saves (prefix_affinity's
        -- LEAVE_COST).
        local score = ms - 2 * saved
        if score <= best_ms then
          best, best_ms = inst, score
        end
      end
    end
    return best or cold
  end,
}
