-- prefix_affinity: send a request where its prompt's prefix was sent
-- before, so the engine's prefix cache already holds those KV blocks --
-- the cache-aware scheme of SGLang's router.
--
-- The gateway keeps an approximate index of the prefix blocks it routed
-- to each instance (bounded, entries expire after 10 minutes);
-- pdgate.prefix_matches() answers, for this request, how many leading
-- blocks each instance received recently. The longest match wins, unless
-- that instance is overloaded compared with the least loaded one (more
-- than BALANCE_ABS requests more, and over BALANCE_REL times as many):
-- then the cache is not worth the queue and the least loaded instance
-- takes the request. A match shorter than MIN_MATCH of the prompt's
-- blocks counts as none. Whichever instance is chosen is recorded as
-- holding this prompt's blocks.
local BALANCE_ABS = 8
local BALANCE_REL = 1.5
local MIN_MATCH = 0.1

-- Where each stage's tie-breaking scan starts; per stage, or a request's
-- prefill pick would always move the decode rotation by the same step.
local turns = { encode = 0, prefill = 0, decode = 0 }

-- Load as pdgate.least_loaded counts it (docs/policies.md): live
-- in-flight plus, when the engine's metrics are fresh, others' load.
local load_of = pdgate.load

return {
  pick = function(ctx, instances)
    local turn = turns[ctx.stage] % #instances + 1
    turns[ctx.stage] = turn
    local least, least_load = pdgate.least_loaded(turn)
    if least == nil then return nil end
    local matches, blocks = pdgate.prefix_matches()
    local best, best_blocks, best_load = nil, 0, 0
    for i, m in pairs(matches) do
      local inst = instances[i]
      if inst.healthy then
        local l = load_of(inst)
        if m > best_blocks or (m == best_blocks and l < best_load) then
          best, best_blocks, best_load = inst, m, l
        end
      end
    end
    if best == nil or best_blocks < MIN_MATCH * blocks then return least end
    if best_load - least_load > BALANCE_ABS and best_load > BALANCE_REL * least_load then
      return least
    end
    return best
  end,
}
