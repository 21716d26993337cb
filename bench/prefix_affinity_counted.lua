-- prefix_affinity (policies/prefix_affinity.lua) with each prefill pick's
-- decision counted (pdgate.count, read from /metrics as
-- pdgate_policy_custom_total{name=...}): picks, recheck (pdgate.RECHECK
-- answered; the second look is a pick, counted as rechecked too), nomatch
-- (no match of at least MIN_MATCH: the soonest cold start), stay /
-- stay_blocks (the match kept), leave / leave_blocks (the match left for
-- the soonest cold start), best_is_cold, and sums of the predictions the
-- leave rule compares (sum_best_ms, sum_cold_ms, sum_saved_ms) with
-- q_0..q_10 / q_neg, a histogram of (wait at the match - soonest cold
-- start) / saved in halves. Same decisions as the shipped policy; for
-- bench/README.md, "Picks that miss each other". routing.sh takes it as a
-- policy name when run from bench/ (cd bench && ./routing.sh --build
-- ../build ... --policies prefix_affinity_counted.lua).
local MIN_MATCH = 0.1
local LEAVE_COST = 3
local origin = math.floor(pdgate.now_ms() * 1000) % 65521
local turns = { encode = origin, prefill = origin, decode = origin }
return {
  pick = function(ctx, instances)
    local turn = turns[ctx.stage] % #instances + 1
    turns[ctx.stage] = turn
    if ctx.stage == "decode" and ctx.prefill ~= nil then
      return pdgate.least_loaded(turn)
    end
    local cold, cold_ms = pdgate.least_cost(turn)
    if cold == nil then return nil end
    local matches, blocks = pdgate.prefix_matches()
    local best, best_blocks, best_ms = nil, 0, 0
    for i, m in pairs(matches) do
      local inst = instances[i]
      if inst.healthy then
        local ms = pdgate.predicted_ttft(inst)
        if m > best_blocks or (m == best_blocks and ms < best_ms) then
          best, best_blocks, best_ms = inst, m, ms
        end
      end
    end
    -- The shipped policy's rechecks, counted apart (recheck): the second
    -- look (ctx.rechecked, counted as rechecked too) is counted as a pick.
    if best == nil or best_blocks < MIN_MATCH * blocks then
      if ctx.recheck_ms > 0 then
        pdgate.count("recheck")
        return pdgate.RECHECK
      end
      pdgate.count("picks")
      if ctx.rechecked then pdgate.count("rechecked") end
      pdgate.count("nomatch")
      return cold
    end
    local _, saved = pdgate.predicted_ttft(best)
    if best_ms - cold_ms > (LEAVE_COST - 1) * saved and ctx.recheck_ms > 0 then
      pdgate.count("recheck")
      return pdgate.RECHECK
    end
    pdgate.count("picks")
    if ctx.rechecked then pdgate.count("rechecked") end
    pdgate.count("match_blocks", best_blocks)
    if best == cold then pdgate.count("best_is_cold") end
    pdgate.count("sum_best_ms", math.floor(best_ms))
    pdgate.count("sum_cold_ms", math.floor(cold_ms))
    pdgate.count("sum_saved_ms", math.floor(saved))
    pdgate.count("sum_fleet_x1000", math.floor(1000 * (best.prefill_ms_per_token or 0)))
    local q = (best_ms - cold_ms) / saved
    local b = "q_neg"
    if q >= 0 then b = "q_" .. math.min(math.floor(q * 2), 10) end
    pdgate.count(b)
    if best_ms - cold_ms > (LEAVE_COST - 1) * saved then
      pdgate.count("leave")
      pdgate.count("leave_blocks", best_blocks)
      return cold
    end
    pdgate.count("stay")
    pdgate.count("stay_blocks", best_blocks)
    return best
  end,
}
