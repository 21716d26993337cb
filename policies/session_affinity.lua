-- session_affinity: requests of one session go to the same instance, by
-- consistent (rendezvous) hashing of the session key: each instance gets a
-- score hash(key, instance id) and the highest score wins, so adding or
-- removing an instance moves only the sessions that scored highest on it.
--
-- Load is bounded (Mirrokni et al., "Consistent Hashing with Bounded
-- Loads"): an instance that would carry more than (1 + EPSILON) times the
-- average in-flight load is passed over for the next best score, so a hot
-- session cannot overload one instance.
--
-- The key is the request's conversation_id, else the header named HEADER.
-- Requests with neither are declined and routed round-robin.
local HEADER = "x-session-id"
local EPSILON = 0.25
-- Requests above the bound an instance may still take: at low load the
-- bound is 1 or 2, and a request or two still finishing must not move a
-- session.
local SLACK = 2

local hash = pdgate.hash
local ceil = math.ceil

return {
  pick = function(ctx, instances)
    local key = ctx.conversation_id or ctx.headers[HEADER]
    if key == nil then return nil end
    local n = #instances
    local total, healthy = 0, 0
    for i = 1, n do
      local inst = instances[i]
      if inst.healthy then
        total = total + inst.in_flight
        healthy = healthy + 1
      end
    end
    if healthy == 0 then return nil end
    -- Counting this request, no instance may carry more than the bound.
    local bound = ceil((total + 1) / healthy * (1 + EPSILON)) + SLACK
    local best, best_score = nil, -1
    local first, first_score = nil, -1 -- best ignoring load, if all are full
    for i = 1, n do
      local inst = instances[i]
      if inst.healthy then
        local score = hash(key, inst.id)
        if score > first_score then first, first_score = inst, score end
        if score > best_score and inst.in_flight + 1 <= bound then
          best, best_score = inst, score
        end
      end
    end
    return best or first
  end,
}
