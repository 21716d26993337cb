-- kv_aware: send a request to the instance whose engine really holds the
-- longest cached prefix of its prompt, known from the engines' own KV
-- cache events (docs/kv-events.md), and fall back to what pdgate routed
-- (prefix_affinity's approximate index) for engines without an exact feed.
--
-- The approximate index remembers where prefixes were *sent*; it cannot
-- know what an engine evicted since, or what reached it from elsewhere
-- (another gateway, a client calling it directly, a KV pull). With small
-- caches that evict, prefix_affinity keeps sending prompts to engines that
-- no longer hold their blocks; the events say which ones still do.
--
-- For a candidate i its cached share of the prompt is
--   exact feed:   pdgate.cached_tokens()[i] / prompt tokens
--   otherwise:    pdgate.prefix_matches()[i] / prompt blocks
-- The largest share wins, unless that instance is overloaded compared with
-- the least loaded one (prefix_affinity's guard: more than BALANCE_ABS
-- requests more, and over BALANCE_REL times as many); a share under
-- MIN_SHARE counts as none and the least loaded instance takes it.
-- prefix_matches() is always asked, so the approximate index keeps
-- learning for engines whose feed falls back.
--
-- Decode after a prefill pulls the KV from the prefill: least loaded.
local BALANCE_ABS = 8
local BALANCE_REL = 1.5
local MIN_SHARE = 0.1

local turns = { encode = 0, prefill = 0, decode = 0 }
local load_of = pdgate.load

return {
  pick = function(ctx, instances)
    local turn = turns[ctx.stage] % #instances + 1
    turns[ctx.stage] = turn
    local least, least_load = pdgate.least_loaded(turn)
    if least == nil then return nil end
    if ctx.stage == "decode" and ctx.prefill ~= nil then return least end

    local matches, blocks = pdgate.prefix_matches()
    local exact, tokens = pdgate.cached_tokens()
    local best, best_share, best_load = nil, 0, 0
    local function consider(inst, share)
      if not inst.healthy then return end
      local l = load_of(inst)
      if share > best_share or (share == best_share and l < best_load) then
        best, best_share, best_load = inst, share, l
      end
    end
    if exact ~= nil and tokens ~= nil and tokens > 0 then
      for i, n in pairs(exact) do
        consider(instances[i], n / tokens)
      end
    end
    if blocks ~= nil and blocks > 0 then
      for i, m in pairs(matches) do
        -- An instance with an exact feed is judged by it alone.
        if exact == nil or exact[i] == nil then
          consider(instances[i], m / blocks)
        end
      end
    end
    if best == nil or best_share < MIN_SHARE then return least end
    if best_load - least_load > BALANCE_ABS and best_load > BALANCE_REL * least_load then
      return least
    end
    return best
  end,
}
