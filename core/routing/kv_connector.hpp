// How prefill hands the KV cache to decode, one plugin per vLLM KV
// connector (--kv-connector, docs/connectors.md). A connector decides the
// bodies and request ids of the two stages; the pipeline runs them.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "core/base/json_body.hpp"
#include "core/base/json_edit.hpp"
#include "core/base/result.hpp"
#include "core/config/config.hpp"

namespace pdgate {

class KvConnector {
 public:
  virtual ~KvConnector() = default;
  virtual std::string_view name() const = 0;
  // false: no prefill stage, one hop to a combined instance.
  virtual bool has_prefill() const { return true; }
  // Whether the request id names the two peers, so decode is chosen before
  // prefill (p2p-nccl).
  virtual bool names_peers() const { return false; }
  // Whether the prefill's answer carries kv_transfer_params for decode
  // (and multi-turn reuse applies).
  virtual bool passes_params() const { return false; }

  // The prefill's body; `kv_params_raw` is what the gateway asks the
  // prefill to do (NIXL's do_remote_decode), ignored by the others.
  // Both bodies are slices of `body` plus small edits (core/base/json_body.hpp):
  // `body` must outlive them.
  virtual SplicedText prefill_body(std::string_view body, const JsonObjectIndex& index,
                                   std::string_view kv_params_raw) const = 0;
  // The decode's body; `kv_params_raw` is the prefill's answer's params
  // (only for connectors that pass them).
  virtual SplicedText decode_body(std::string_view body, const JsonObjectIndex& index,
                                  std::optional<std::string_view> kv_params_raw) const = 0;
  // The X-Request-Id both stages carry. `uuid_hex` is 32 fresh hex digits.
  virtual std::string stage_request_id(const std::string& client_id, const UpstreamSpec* prefill,
                                       const UpstreamSpec* decode,
                                       std::string_view uuid_hex) const {
    (void)prefill;
    (void)decode;
    (void)uuid_hex;
    return client_id;
  }
};

}  // namespace pdgate
