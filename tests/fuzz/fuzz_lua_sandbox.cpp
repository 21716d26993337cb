// Fuzzes the policy sandbox's time guarantee: whatever the script, loading
// it, a pick and an on_complete each return within their budget plus a
// bounded overrun, and the process neither crashes nor leaks (ASan/UBSan);
// so does the request hook (on_request), whose answer is a status in
// 400..599 when it rejects.
//
// The first input byte picks the mode:
//  - even: the rest of the input is Lua source, loaded as a policy;
//  - odd: the rest is read as choices in a small grammar of risky snippets
//    (loops, pcall/xpcall nesting, metamethods, patterns, sort, gsub, big
//    strings), assembled into a policy whose pick and on_complete run them.
// A call that takes longer than its budget plus kSlack traps.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "policies/local_kv_index.hpp"
#include "policies/lua_vm.hpp"
#include "policies/lua_watchdog.hpp"

namespace {

using namespace pdgate;
using namespace pdgate::policy;
using Clock = std::chrono::steady_clock;

// The pick budget under test, and the overrun tolerated on top of any
// budget: generous, so that only a real escape (not a slow sanitizer
// build or a busy machine) traps.
constexpr auto kPickBudget = std::chrono::milliseconds(2);
constexpr auto kLoadBudget = std::chrono::milliseconds(200);
constexpr auto kSlack = std::chrono::milliseconds(200);

// Reads bytes as small numbers; zeros once the input is used up.
class Choices {
 public:
  Choices(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  unsigned next(unsigned n) { return pos_ < size_ ? data_[pos_++] % n : 0; }
  bool done() const { return pos_ >= size_; }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

// Statements that each try to hold the worker; `X` is replaced by another
// snippet, so they nest (a loop in a handler in a comparator ...).
const char* const kSnippets[] = {
    "while true do X end",
    "for i = 1, 1e9 do X end",
    "pcall(function() X end)",
    "xpcall(function() X end, function(e) X end)",
    "xpcall(function() error({}) end, function(e) X return e end)",
    "pcall(error, setmetatable({}, { __tostring = function() X return 'e' end }))",
    "local m = setmetatable({}, { __index = function() X end }) local _ = m.x",
    "local m = setmetatable({}, { __newindex = function() X end }) m.x = 1",
    "local mt = { __eq = function() X return true end } local _ = setmetatable({}, mt) == "
    "setmetatable({}, mt)",
    "local mt = { __lt = function() X return true end } table.sort({ setmetatable({}, mt), "
    "setmetatable({}, mt), setmetatable({}, mt) })",
    "local m = setmetatable({}, { __concat = function() X return '' end }) local _ = m .. 'x'",
    "local m = setmetatable({}, { __call = function() X end }) m()",
    "table.sort({ 5, 3, 1, 4, 2 }, function(a, b) X return a < b end)",
    "string.gsub('abcabc', '%w', function(c) X return c end)",
    "for w in string.gmatch('a b c', '%a') do X end",
    "string.find(big, '.-.-.-.-b')",
    "string.match(big, '(.-)(.-)(.-)b')",
    "string.gsub(big, '(a*)(a*)b', '%2%1')",
    "string.find(opens, '%b()')",
    "string.find(big, string.rep('a', 999) .. 'b', 1, true)",
    "local s = 'x' for i = 1, 40 do s = s .. s end",
    "local s = string.rep('ab', 4e6) X",
    "local t = {} for i = 1, 3e5 do t[i] = -i end table.sort(t) X",
    "keep[#keep + 1] = string.rep('k', 1e5) X",
    "table.concat(keep) X",
    "local r = recurse(X_DEPTH)",
    "X",
    "",
};

std::string expand(Choices& c, int depth) {
  constexpr unsigned n = sizeof(kSnippets) / sizeof(kSnippets[0]);
  std::string s = kSnippets[depth > 4 ? n - 1 : c.next(n)];
  for (std::size_t at = s.find('X'); at != std::string::npos; at = s.find('X', at)) {
    if (s.compare(at, 7, "X_DEPTH") == 0) {
      const std::string d = std::to_string(c.next(300));
      s.replace(at, 7, d);
      at += d.size();
      continue;
    }
    const std::string inner = depth > 4 ? "" : expand(c, depth + 1);
    s.replace(at, 1, inner);
    at += inner.size();
  }
  return s;
}

std::string grammar_script(Choices& c) {
  std::string top = expand(c, 3);  // top-level code, shallower
  std::string pick = expand(c, 0);
  std::string complete = expand(c, 1);
  std::string request = expand(c, 1);
  return "local big = string.rep('a', 2e4)\n"
         "local opens = string.rep('(', 2e4)\n"
         "keep = {}\n"
         "local function recurse(n) if n <= 0 then return 0 end "
         "return select(2, pcall(recurse, n - 1)) end\n"
         "do " +
         top +
         " end\n"
         "return { pick = function(ctx, instances)\n"
         "  if ctx.model == 'go' then " +
         pick +
         " end\n"
         "  return 1\n"
         "end,\n"
         "on_complete = function(ctx) if ctx.model == 'go' then " +
         complete +
         " end end,\n"
         "on_request = function(req) if req.model == 'go' then " +
         request +
         " end\n"
         "  if req.body.max_tokens then req:cap_max_tokens(req.body.max_tokens) end\n"
         "  return req.body.user == 'no' and 403 or nil, 'refused'\n"
         "end }\n";
}

[[noreturn]] void overran(const char* what, Clock::duration took) {
  std::fprintf(
      stderr, "%s took %lld ms: the budget did not hold\n", what,
      static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()));
  __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0)
    return 0;
  Choices choices(data + 1, size - 1);
  const std::string script = (data[0] & 1) == 0
                                 ? std::string(reinterpret_cast<const char*>(data + 1), size - 1)
                                 : grammar_script(choices);
  KvStore kv;
  LocalKvIndex kv_index(1024, 600'000, 64);
  VmServices svc;
  svc.budget = kPickBudget;
  svc.memory_limit = 32u << 20;
  svc.kv = &kv;
  svc.kv_index = &kv_index;
  // One watchdog thread for the whole run, as one engine has.
  static PolicyWatchdog watchdog;
  svc.watchdog = &watchdog;
  PolicyBundle bundle;
  for (auto& s : bundle.stages) {
    s.spec = "fuzz.lua";
    s.origin = "fuzz.lua";
    s.text = script;
  }
  auto t0 = Clock::now();
  auto vm = LuaVm::create(bundle, svc);
  if (Clock::now() - t0 > kLoadBudget + kSlack)
    overran("load", Clock::now() - t0);
  if (!vm)
    return 0;
  std::vector<InstancePtr> instances;
  for (std::uint64_t i = 0; i < 3; ++i) {
    UpstreamSpec spec;
    spec.role = Role::decode;
    spec.host = "fuzz.invalid";
    spec.port = static_cast<std::uint16_t>(8000 + i);
    spec.url = "http://fuzz.invalid:" + std::to_string(spec.port);
    instances.push_back(std::make_shared<Instance>(i + 1, spec));
  }
  PrefixHashCache hashes;
  PickContext ctx;
  ctx.stage = Stage::decode;
  ctx.request_id = "fuzz";
  ctx.prompt_raw = "fuzz prompt";
  // Twice each: state kept from the first call must not break the second.
  for (int round = 0; round < 2; ++round) {
    ctx.model = "go";
    t0 = Clock::now();
    const PickAnswer a = (*vm)->pick(instances, ctx, hashes);
    if (Clock::now() - t0 > kPickBudget + kSlack)
      overran("pick", Clock::now() - t0);
    if (a.status == PickStatus::chosen && a.index >= instances.size())
      __builtin_trap();
    PickOutcome o;
    o.ok = true;
    o.status = 200;
    t0 = Clock::now();
    (void)(*vm)->on_complete(*instances[0], ctx, o, hashes);
    if (Clock::now() - t0 > kPickBudget + kSlack)
      overran("on_complete", Clock::now() - t0);
  }
  static constexpr std::string_view kBody =
      R"({"model":"go","messages":[{"role":"user","content":"x"}],"max_tokens":9,"user":"no"})";
  const auto index = index_json_object(kBody);
  RequestHookInput in;
  in.request_id = "fuzz";
  in.body = kBody;
  in.index = &*index;
  in.is_chat = true;
  in.model = "go";
  in.prompt_bytes = 32;
  for (int round = 0; round < 2; ++round) {
    RequestDecision d;
    t0 = Clock::now();
    const HookAnswer a = (*vm)->on_request(in, d, hashes);
    if (Clock::now() - t0 > kPickBudget + kSlack)
      overran("on_request", Clock::now() - t0);
    if (a.status == HookStatus::rejected && (d.reject_status < 400 || d.reject_status > 599))
      __builtin_trap();
  }
  // The state still serves an ordinary pick within its budget.
  ctx.model = "plain";
  t0 = Clock::now();
  (void)(*vm)->pick(instances, ctx, hashes);
  if (Clock::now() - t0 > kPickBudget + kSlack)
    overran("plain pick", Clock::now() - t0);
  return 0;
}
