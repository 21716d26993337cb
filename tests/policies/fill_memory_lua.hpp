// A Lua function, fill(), that takes every byte a policy's state may still
// allocate (--policy-memory), for the tests of a policy whose state is full
// (issue 32, item 1). Prepended to a test's script text.
#pragma once

namespace pdgate::policy::test {

inline constexpr const char* kFillMemoryLua = R"lua(
    local keep = {}
    local function fill()
      for _, size in ipairs({65536, 4096, 256, 16, 1}) do
        pcall(function()
          while true do keep[#keep + 1] = string.rep("y", size) .. #keep end
        end)
      end
      -- Whatever is left is taken by small tables.
      pcall(function() while true do keep[#keep + 1] = {} end end)
    end
)lua";

}  // namespace pdgate::policy::test
