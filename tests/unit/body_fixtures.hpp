// Request bodies and params the body tests share (request facts, KV
// params, the connectors' bodies).
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/base/json_body.hpp"

namespace pdgate::test {

inline JsonObjectIndex must_index(std::string_view text) {
  auto r = index_json_object(text);
  EXPECT_TRUE(r.ok()) << r.error() << "\n" << text;
  return r.ok() ? *r : JsonObjectIndex{};
}

// Parses a rendered body after checking our own validator accepts it too.
inline nlohmann::json parsed(const std::string& text) {
  EXPECT_TRUE(index_json_object(text).ok()) << text;
  return nlohmann::json::parse(text);
}

inline const std::string kCompletions =
    R"({"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"Tell me a story \u00e9",)"
    R"("max_tokens":50,"stream":true,"stream_options":{"include_usage":true},)"
    R"("min_tokens":5,"conversation_id":"conv-1","kv_transfer_params":{"evil":true},)"
    R"("temperature":0.0,"echo":false})";

inline const std::string kChat =
    R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url",)"
    R"("image_url":{"url":"data:image/png;base64,AAAA"}},{"type":"text","text":"hi"}]}],)"
    R"("max_completion_tokens":64,"max_tokens":64,"stream":true,"conversation_id":"c"})";

inline const std::string kPrefillParams =
    R"({"do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": [[1,2,3]],)"
    R"( "remote_engine_id": "0a1b-uuid", "remote_request_id": "cmpl-x-0-1a2b3c4d",)"
    R"( "remote_host": "10.0.0.5", "remote_port": 5600, "tp_size": 1, "future_field": {"x":[]}})";

}  // namespace pdgate::test
