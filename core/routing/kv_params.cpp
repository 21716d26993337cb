#include "core/routing/kv_params.hpp"

#include "core/base/json_body.hpp"
#include "core/base/json_edit.hpp"

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

}  // namespace pdgate
