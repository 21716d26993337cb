-- prefix_affinity: send a request where its prompt's prefix was sent
-- before, so the engine's prefix cache already holds those KV blocks --
-- the cache-aware scheme of SGLang's router.
--
-- The gateway keeps an approximate index of the prefix blocks it routed
-- to each instance (bounded, entries expire); pdgate.prefix_matches()
-- answers, for this request, how many leading blocks each instance
-- received recently. The longest match wins, unless the system is
-- imbalanced: when the most and least loaded instances differ by more
-- than BALANCE_ABS requests and by a factor over BALANCE_REL, a long
-- match on an overloaded instance is not worth the wait, and the least
-- loaded instance takes the request. A match shorter than MIN_MATCH of
-- the prompt's blocks is treated as no match.
local BALANCE_ABS = 8
local BALANCE_REL = 1.5
local MIN_MATCH = 0.1

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
    local least, least_load, max_load = nil, math.huge, -1
    for k = 0, n - 1 do
      local inst = instances[(turn + k - 1) % n + 1]
      if inst.healthy then
        local l = load_of(inst)
        if l < least_load then least, least_load = inst, l end
        if l > max_load then max_load = l end
      end
    end
    if least == nil then return nil end

    local matches, blocks = pdgate.prefix_matches()
    local best, best_blocks = nil, 0
    if blocks > 0 then
      for i = 1, n do
        local inst = instances[i]
        local m = matches[inst.id]
        if m and inst.healthy and (m > best_blocks or
            (m == best_blocks and load_of(inst) < load_of(best))) then
          best, best_blocks = inst, m
        end
      end
    end
    if best == nil or best_blocks < MIN_MATCH * blocks then return least end
    local l = load_of(best)
    if l - least_load > BALANCE_ABS and l > BALANCE_REL * least_load then return least end
    return best
  end,
}
