// pdgate.cached_tokens(): what a policy sees of the exact KV-block index.
#include <gtest/gtest.h>

#include "core/routing/kv_block_index.hpp"
#include "tests/policies/policy_test_util.hpp"

namespace pdgate::policy::test {
namespace {

// Each byte of the raw prompt is one token id: enough to line requests up with stored blocks.
class ByteTokenizer final : public Tokenizer {
 public:
  std::optional<std::vector<std::uint32_t>> token_ids(bool, std::string_view raw) const override {
    if (raw.empty())
      return std::nullopt;
    return std::vector<std::uint32_t>(raw.begin(), raw.end());
  }
};

// Picks the candidate with the most cached tokens among those reported; the 2nd when none is
// reported, the 4th when there is no exact data at all (nil).
constexpr const char* kScript = R"(
return { pick = function(ctx, instances)
  local cached, total = pdgate.cached_tokens()
  if cached == nil then return instances[4] end
  assert(total == 48, "prompt tokens " .. tostring(total))
  local best, best_n = instances[2], -1
  for i, n in pairs(cached) do
    if n > best_n then best, best_n = instances[i], n end
  end
  return best
end }
)";

KvBlockStored blocks(const std::string& tokens, std::uint64_t first_hash) {
  KvBlockStored s;
  s.block_size = 16;
  s.token_ids.assign(tokens.begin(), tokens.end());
  for (std::size_t i = 0; i < tokens.size() / 16; ++i)
    s.block_hashes.push_back(first_hash + i);
  return s;
}

// Exact feeds report their cached tokens by position; a feed in fallback is left out; without a
// tokenizer the function returns nil.
TEST(CachedTokens, ReportsExactFeedsOnly) {
  TempScript script(kScript);
  auto inst = fake_instances(4);
  const std::string prompt(48, 'q');
  PickContext ctx;
  ctx.stage = Stage::decode;
  ctx.request_id = "r1";
  ctx.prompt_raw = prompt;

  auto plain = engine_for(script.path());
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->make_picker(0)->pick(inst, ctx), inst[3]);

  auto index = std::make_shared<KvBlockIndex>();
  const auto key = [&](int i) { return instance_key(inst[i]->spec.url); };
  index->apply(key(0), blocks(std::string(16, 'q'), 100));
  index->clear(key(0), KvFeedState::fallback);
  index->apply(key(0), blocks(std::string(16, 'q'), 100));
  index->apply(key(2), blocks(std::string(32, 'q'), 200));
  index->set_state(key(2), KvFeedState::exact);
  auto e = engine_for(script.path());
  ASSERT_TRUE(e);
  e->set_exact_kv(index, std::make_shared<ByteTokenizer>());
  EXPECT_EQ(e->make_picker(0)->pick(inst, ctx), inst[2]);
  EXPECT_EQ(e->stats().errors.load(), 0u);

  // No exact feed left: nothing reported (not even the fallback one's blocks).
  index->set_state(key(2), KvFeedState::fallback);
  EXPECT_EQ(e->make_picker(0)->pick(inst, ctx), inst[1]);
  EXPECT_EQ(e->stats().errors.load(), 0u);
}

}  // namespace
}  // namespace pdgate::policy::test
