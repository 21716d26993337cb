-- conversation_decode: a conversation's next turn goes to the decode that
-- served its previous turn (it may still hold the conversation's KV
-- blocks), when that decode is healthy and not overloaded compared with
-- the least loaded one; otherwise, and for the other stages, the least
-- loaded instance. The gateway remembers which decode served each
-- conversation_id (pdgate.conversation()).
local MAX_EXTRA = 4    -- requests above the least loaded it may carry
local MAX_RATIO = 2.0  -- ... and by at most this factor

-- Where each stage's tie-breaking scan starts: per stage (or a request's
-- prefill pick would always move the decode rotation by the same step),
-- and from a point of this worker's own, the clock's microseconds when the
-- script loaded: replicas (and workers) behind one balancer, each taking
-- every Nth request, would otherwise move in lockstep and send their tied
-- picks to the same instance.
local origin = math.floor(pdgate.now_ms() * 1000) % 65521
local turns = { encode = origin, prefill = origin, decode = origin }

-- Load as pdgate.least_loaded counts it (docs/policies.md): live
-- in-flight plus, when the engine's metrics are fresh, others' load.
local load_of = pdgate.load

return {
  pick = function(ctx, instances)
    local n = #instances
    local turn = turns[ctx.stage] % n + 1
    turns[ctx.stage] = turn
    local least, least_load = pdgate.least_loaded(turn)
    local conv = ctx.stage == "decode" and ctx.conversation_id and pdgate.conversation()
    local previous = nil
    if conv and conv.decode then
      for i = 1, n do
        local inst = instances[i]
        if inst.id == conv.decode and inst.healthy then previous = inst end
      end
    end
    if previous ~= nil then
      local l = load_of(previous)
      if l - least_load <= MAX_EXTRA or l <= MAX_RATIO * least_load then return previous end
    end
    return least
  end,
}
