#include "core/routing/kv_params.hpp"

#include "core/base/json_body.hpp"
#include "core/base/json_edit.hpp"

#include <algorithm>
#include <charconv>

namespace pdgate {

Result<std::optional<std::string>> extract_kv_params(std::string_view response_body) {
  const auto index = index_json_object(response_body);
  if (!index)
    return fail("prefill response: " + index.error());
  const auto raw = raw_member(response_body, *index, "kv_transfer_params");
  if (!raw || *raw == "null")
    return std::optional<std::string>();
  if (raw->empty() || raw->front() != '{')
    return fail("prefill response: kv_transfer_params is not an object");
  return std::optional<std::string>(std::string(*raw));
}

Result<std::string> kv_params_for_next_turn_prefill(std::string_view decode_params_raw,
                                                    std::string_view decode_host) {
  const auto index = index_json_object(decode_params_raw);
  if (!index)
    return fail("decode kv_transfer_params: " + index.error());
  JsonBodyEditor e(decode_params_raw, *index);
  e.set("do_remote_decode", "true");
  e.set("do_remote_prefill", "false");
  e.set("remote_host", json_quote(decode_host));
  return e.render();
}

bool answers_push(std::string_view answer_params_raw) {
  const auto index = index_json_object(answer_params_raw);
  if (!index)
    return false;
  const auto mode = raw_member(answer_params_raw, *index, "transfer_mode");
  return mode && *mode == "\"push\"";
}

Result<std::string> nixl_push_decode_params(std::string_view answer_params_raw) {
  const auto index = index_json_object(answer_params_raw);
  if (!index)
    return fail("prefill kv_transfer_params: " + index.error());
  std::string out = R"({"do_remote_prefill":true,"do_remote_decode":false)";
  for (const char* key :
       {"remote_engine_id", "remote_request_id", "remote_host", "remote_port", "tp_size"}) {
    const auto raw = raw_member(answer_params_raw, *index, key);
    if (!raw || *raw == "null")
      return fail(std::string("prefill kv_transfer_params lack ") + key +
                  " (needed by a NIXL push decode)");
    out += ',';
    out += json_quote(key);
    out += ':';
    out += *raw;
  }
  out += '}';
  return out;
}

std::string mooncake_prefill_params(std::string_view transfer_id) {
  return R"({"do_remote_decode":true,"do_remote_prefill":false,"transfer_id":)" +
         json_quote(transfer_id) + "}";
}

std::string mooncake_decode_params(std::string_view transfer_id, std::string_view bootstrap_addr,
                                   std::string_view remote_engine_id) {
  return R"({"do_remote_decode":false,"do_remote_prefill":true,"transfer_id":)" +
         json_quote(transfer_id) + R"(,"remote_bootstrap_addr":)" + json_quote(bootstrap_addr) +
         R"(,"remote_engine_id":)" + json_quote(remote_engine_id) + "}";
}

namespace {

constexpr std::uint32_t kMaxRank = 4096;
constexpr std::size_t kMaxRanks = 1024;
constexpr std::size_t kMaxEngineId = 256;

std::optional<std::uint32_t> parse_rank(std::string_view s) {
  if (s.empty() || s.size() > 4)
    return std::nullopt;
  std::uint32_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v >= kMaxRank)
    return std::nullopt;
  return v;
}

bool printable(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return static_cast<unsigned char>(c) >= 0x20 && c != 0x7f; });
}

}  // namespace

Result<std::vector<RankEngineId>> parse_mooncake_query(std::string_view answer) {
  const auto index = index_json_object(answer);
  if (!index)
    return fail("bootstrap /query: " + index.error());
  if (index->members.empty())
    return fail("bootstrap /query: no rank");
  if (index->members.size() > kMaxRanks)
    return fail("bootstrap /query: too many ranks");
  std::vector<RankEngineId> out;
  for (const auto& m : index->members) {
    const auto rank = parse_rank(m.key);
    if (!rank)
      return fail("bootstrap /query: a rank is not a number below 4096");
    const std::string_view entry = answer.substr(m.value_begin, m.value_end - m.value_begin);
    const auto entry_index = index_json_object(entry);
    if (!entry_index)
      return fail("bootstrap /query: rank " + std::to_string(*rank) + " is not an object");
    const auto id_raw = raw_member(entry, *entry_index, "engine_id");
    const auto id = id_raw ? decode_json_string(*id_raw) : std::nullopt;
    if (!id || id->empty() || id->size() > kMaxEngineId || !printable(*id))
      return fail("bootstrap /query: rank " + std::to_string(*rank) + " has no usable engine_id");
    out.push_back({*rank, *id});
  }
  std::sort(out.begin(), out.end(),
            [](const RankEngineId& a, const RankEngineId& b) { return a.rank < b.rank; });
  for (std::size_t i = 1; i < out.size(); ++i) {
    if (out[i].rank == out[i - 1].rank)
      return fail("bootstrap /query: rank " + std::to_string(out[i].rank) + " twice");
  }
  return out;
}

}  // namespace pdgate
