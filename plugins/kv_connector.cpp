#include "plugins/kv_connectors.hpp"

#include "core/base/json_edit.hpp"
#include "plugins/kv_bodies.hpp"

namespace pdgate {

namespace {

// NixlConnector: the prefill answers with kv_transfer_params that tell
// decode where to pull the blocks from (today's flow).
class Nixl final : public KvConnector {
 public:
  std::string_view name() const override { return "nixl"; }
  bool passes_params() const override { return true; }
  SplicedText prefill_body(std::string_view body, const JsonObjectIndex& index,
                           std::string_view kv_params_raw) const override {
    return splice_prefill_body(body, index, kv_params_raw);
  }
  SplicedText decode_body(std::string_view body, const JsonObjectIndex& index,
                          std::optional<std::string_view> kv_params_raw) const override {
    return splice_decode_body(body, index, kv_params_raw);
  }
};

// Connectors whose KV cache travels out of band (the prefill stores it or
// sends it to its peer itself): no params in either body.
class OutOfBand : public KvConnector {
 public:
  SplicedText prefill_body(std::string_view body, const JsonObjectIndex& index,
                           std::string_view) const override {
    return splice_one_token_body(body, index);
  }
  SplicedText decode_body(std::string_view body, const JsonObjectIndex& index,
                          std::optional<std::string_view>) const override {
    return splice_passthrough_body(body, index);
  }
};

// LMCache / shared storage: the prefill stores the KV cache out of band and
// decode finds it there; no params travel.
class LmCache final : public OutOfBand {
 public:
  std::string_view name() const override { return "lmcache"; }
};

// P2pNcclConnector: the engines find each other from the request id,
// which names both ZMQ addresses; no params travel.
class P2pNccl final : public OutOfBand {
 public:
  std::string_view name() const override { return "p2p-nccl"; }
  bool names_peers() const override { return true; }
  std::string stage_request_id(const std::string&, const UpstreamSpec* prefill,
                               const UpstreamSpec* decode,
                               std::string_view uuid_hex) const override {
    std::string id = "___prefill_addr_";
    if (prefill != nullptr)
      id += prefill->kv_peer;
    id += "___decode_addr_";
    if (decode != nullptr)
      id += decode->kv_peer;
    id += '_';
    id += uuid_hex;
    return id;
  }
};

// A combined P+D instance: one hop, body untouched.
class None final : public KvConnector {
 public:
  std::string_view name() const override { return "none"; }
  bool has_prefill() const override { return false; }
  SplicedText prefill_body(std::string_view, const JsonObjectIndex&,
                           std::string_view) const override {
    return {};
  }
  SplicedText decode_body(std::string_view body, const JsonObjectIndex& index,
                          std::optional<std::string_view>) const override {
    return splice_passthrough_body(body, index);
  }
};

}  // namespace

std::unique_ptr<const KvConnector> make_kv_connector(std::string_view name) {
  if (name == "nixl")
    return std::make_unique<Nixl>();
  if (name == "lmcache")
    return std::make_unique<LmCache>();
  if (name == "p2p-nccl")
    return std::make_unique<P2pNccl>();
  if (name == "none")
    return std::make_unique<None>();
  return nullptr;
}

}  // namespace pdgate
