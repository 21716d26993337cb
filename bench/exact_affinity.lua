-- exact_affinity (benchmark policy, not shipped): prefix_affinity on the
-- exact KV index. The candidate whose engine holds the most leading
-- tokens of the prompt by its own KV events (pdgate.cached_tokens(),
-- docs/kv-events.md) wins, unless it carries more than BALANCE_ABS
-- requests more than the least loaded and over BALANCE_REL times as many
-- (prefix_affinity's guard); a match under MIN_MATCH of the prompt counts
-- as none. Without exact data (no tokenizer, or no feed) it behaves as
-- prefix_affinity would on pdgate.prefix_matches().
local BALANCE_ABS = 8
local BALANCE_REL = 1.5
local MIN_MATCH = 0.1
local turns = { encode = 0, prefill = 0, decode = 0 }
local load_of = pdgate.load

return {
  pick = function(ctx, instances)
    local turn = turns[ctx.stage] % #instances + 1
    turns[ctx.stage] = turn
    local least, least_load = pdgate.least_loaded(turn)
    if least == nil then return nil end
    local matches, total = pdgate.cached_tokens()
    if matches == nil then
      matches, total = pdgate.prefix_matches()
    end
    local best, best_n, best_load = nil, 0, 0
    for i, n in pairs(matches) do
      local inst = instances[i]
      if inst.healthy then
        local l = load_of(inst)
        if n > best_n or (n == best_n and l < best_load) then
          best, best_n, best_load = inst, n, l
        end
      end
    end
    if best == nil or best_n < MIN_MATCH * total then return least end
    if best_load - least_load > BALANCE_ABS and best_load > BALANCE_REL * least_load then
      return least
    end
    return best
  end,
}
