// Differential and invariant fuzzing of the in-place JSON layer: our
// validator must agree with nlohmann (apart from the documented
// differences), and every rewrite of an accepted body must stay valid.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/json_body.hpp"
#include "core/base/json_edit.hpp"
#include "core/pipeline/prompt_logprobs.hpp"
#include "core/routing/kv_params.hpp"
#include "core/routing/request_facts.hpp"
#include "core/routing/tokenize_message.hpp"
#include "plugins/kv_bodies.hpp"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant failed: %s\n", what);
    std::abort();
  }
}

// nlohmann's verdict: accepted as an object, or failed only because a
// number overflows a double (RFC 8259 grammar allows it; we accept it).
bool nlohmann_accepts_object(std::string_view text, bool& overflow_only) {
  overflow_only = false;
  try {
    return nlohmann::json::parse(text).is_object();
  } catch (const nlohmann::json::out_of_range&) {
    overflow_only = true;
  } catch (const nlohmann::json::exception&) {
  }
  return false;
}

bool index_ok(const std::string& text) {
  return pdgate::index_json_object(text).ok();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto idx = pdgate::index_json_object(text);
  bool overflow_only = false;
  const bool theirs = nlohmann_accepts_object(text, overflow_only);
  if (idx.ok() && !theirs)
    check(overflow_only, "accepted a text nlohmann rejects");
  if (!idx.ok() && theirs) {
    // Known differences: nlohmann skips a UTF-8 BOM, stops reading at a NUL
    // byte (so "{}\0junk" passes) and has no depth limit.
    const bool bom = text.substr(0, 3) == "\xef\xbb\xbf";
    const bool nul = text.find('\0') != std::string_view::npos;
    const bool deep = idx.error().find("nesting") != std::string::npos;
    check(bom || nul || deep, "rejected a text nlohmann accepts");
  }
  (void)pdgate::extract_kv_params(text);
  // A prefill's answer in NIXL's push form, and a Mooncake bootstrap
  // server's /query answer: untrusted engine output.
  (void)pdgate::answers_push(text);
  if (const auto push = pdgate::nixl_push_decode_params(text))
    check(index_ok(*push), "push decode params invalid");
  if (const auto ranks = pdgate::parse_mooncake_query(text)) {
    check(!ranks->empty() && ranks->size() <= 1024, "bootstrap answer out of bounds");
    for (const auto& r : *ranks)
      check(r.rank < 4096 && !r.engine_id.empty() && r.engine_id.size() <= 256,
            "bootstrap rank out of bounds");
  }
  // prefill's prompt_logprobs read from its answer, and put into decode's:
  // whatever either engine sends, what comes out is JSON the validator
  // takes (never deeper than its bound).
  if (const auto lp = pdgate::prompt_logprobs_of(text)) {
    check(pdgate::validate_json(*lp).ok(), "prompt_logprobs read as invalid JSON");
    if (const auto merged = pdgate::with_prompt_logprobs(text, *lp))
      check(pdgate::index_json_object(*merged).ok(), "merged answer is not a JSON object");
  }
  if (const auto merged = pdgate::with_prompt_logprobs(text, "[null]"))
    check(pdgate::index_json_object(*merged).ok(), "merged answer is not a JSON object");
  // An engine's /tokenize answer: ids only from an object nlohmann reads.
  if (pdgate::parse_tokenize_answer(text))
    check(theirs, "token ids read from a text that is not a JSON object");
  if (!idx.ok())
    return 0;

  for (const auto& m : idx->members) {
    check(pdgate::validate_json(text.substr(m.value_begin, m.value_end - m.value_begin)).ok(),
          "member value does not validate on its own");
    check(m.begin < m.value_begin && m.value_end == m.end && m.end <= idx->close_brace,
          "member ranges out of order");
  }
  check(pdgate::JsonBodyEditor(text, *idx).render() == text, "render without edits differs");
  // A policy's req:body_field: a path the input's bytes choose (positions,
  // and the members' own names) leads to a value of the text, or nothing.
  if (!idx->members.empty()) {
    std::vector<pdgate::JsonPathStep> path;
    for (std::size_t i = 0; i < size % (pdgate::kMaxJsonPathSteps + 2); ++i) {
      const auto b = static_cast<unsigned char>(text[(i * 7) % size]);
      if (b % 2 == 0)
        path.push_back({{}, static_cast<std::size_t>(b % 5), true});
      else
        path.push_back({idx->members[b % idx->members.size()].key});
    }
    if (const auto v = pdgate::raw_at_path(text, path.data(), path.size())) {
      check(v->data() >= text.data() && v->data() + v->size() <= text.data() + text.size(),
            "a path's value is not part of the text");
      check(pdgate::validate_json(*v).ok(), "a path's value does not validate on its own");
    }
  }

  const std::string prefill = pdgate::make_prefill_body(text, *idx);
  const auto pidx = pdgate::index_json_object(prefill);
  check(pidx.ok(), "prefill body invalid");
  check(pdgate::raw_member(prefill, *pidx, "stream") == "false", "prefill stream not false");
  check(pdgate::raw_member(prefill, *pidx, "max_tokens") == "1", "prefill max_tokens not 1");
  check(!pdgate::raw_member(prefill, *pidx, "conversation_id"), "prefill keeps conversation_id");
  check(!pdgate::raw_member(prefill, *pidx, "stream_options"), "prefill keeps stream_options");

  const std::string decode =
      pdgate::make_decode_body(text, *idx, std::string_view(R"({"remote_block_ids":[[1]]})"));
  check(index_ok(decode), "decode body invalid");
  check(index_ok(pdgate::make_passthrough_body(text, *idx)), "passthrough body invalid");
  if (!idx->members.empty()) {
    pdgate::JsonBodyEditor without_first(text, *idx);
    without_first.remove(idx->members.front().key);
    check(index_ok(without_first.render()), "member removal output invalid");
  }
  (void)pdgate::read_facts(text, *idx, size % 2 == 0);
  // /v1/responses reads `input`, max_output_tokens, previous_response_id.
  (void)pdgate::read_facts(text, *idx, pdgate::GenerationApi::responses);
  const auto next = pdgate::kv_params_for_next_turn_prefill(text, "h");
  check(next.ok() && index_ok(*next), "next-turn params invalid");
  return 0;
}
