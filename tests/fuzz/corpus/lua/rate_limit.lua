 return { pick = function(ctx, instances) return 1 end, on_request = function(req) for i = 1, 6 do req:rate_limit(string.rep('k', i * 40), i, i / 3, 'over') end end }
