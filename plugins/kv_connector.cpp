#include "plugins/kv_connectors.hpp"

#include <array>

#include "core/base/json_edit.hpp"
#include "plugins/kv_bodies.hpp"

namespace pdgate {

namespace {

// The forms pdgate speaks (docs/protocol.md names the vLLM source each was
// checked against).
constexpr std::array kForms = {
    // NixlConnector: prefill keeps its blocks and answers where they are;
    // decode pulls them (or, push, registers and prefill writes them).
    ConnectorForm{.name = "nixl",
                  .order = LegOrder::sequential,
                  .prefill_params = PrefillParams::export_blocks,
                  .decode_params = DecodeParams::prefill_answer,
                  .reuses_turns = true},
    // MooncakeConnector: both legs at once under a transfer id the gateway
    // mints; decode finds prefill through its bootstrap server.
    ConnectorForm{.name = "mooncake",
                  .order = LegOrder::parallel,
                  .prefill_params = PrefillParams::transfer_id,
                  .decode_params = DecodeParams::gateway_minted},
    // P2pNcclConnector: the engines find each other from the request id,
    // which names both ZMQ addresses; no params travel.
    ConnectorForm{
        .name = "p2p-nccl", .order = LegOrder::sequential, .stage_id = StageIdForm::peer_addresses},
    // LMCache / shared storage: prefill stores the cache out of band and
    // decode finds it there; no params travel.
    ConnectorForm{.name = "lmcache", .order = LegOrder::sequential},
    // A combined P+D instance: one hop, body untouched.
    ConnectorForm{.name = "none", .order = LegOrder::one_hop},
};

// Mooncake's older engines take the NIXL pull form (sequential legs, the
// prefill's answer relayed): --mooncake-legs sequential.
constexpr ConnectorForm kMooncakeSequential{.name = "mooncake",
                                            .order = LegOrder::sequential,
                                            .prefill_params = PrefillParams::export_blocks,
                                            .decode_params = DecodeParams::prefill_answer,
                                            .reuses_turns = true};

// The connector of a form: builds each leg's body as the form says.
class FormConnector final : public KvConnector {
 public:
  using KvConnector::KvConnector;
  SplicedText prefill_body(std::string_view body, const JsonObjectIndex& index,
                           std::string_view kv_params_raw, OneTokenFields fields) const override;
  Result<SplicedText> decode_body(std::string_view body, const JsonObjectIndex& index,
                                  std::optional<std::string_view> answer_params) const override;
  SplicedText decode_body(std::string_view body, const JsonObjectIndex& index,
                          const MintedTransfer& minted) const override;
  std::string stage_request_id(const std::string& client_id, const UpstreamSpec* prefill,
                               const UpstreamSpec* decode,
                               std::string_view uuid_hex) const override;
};

SplicedText FormConnector::prefill_body(std::string_view body, const JsonObjectIndex& index,
                                        std::string_view kv_params_raw,
                                        OneTokenFields fields) const {
  switch (form().prefill_params) {
    case PrefillParams::none:
      return splice_one_token_body(body, index, fields);
    case PrefillParams::export_blocks:
    case PrefillParams::transfer_id:
      return splice_prefill_body(body, index, kv_params_raw, fields);
  }
  return {};
}

Result<SplicedText> FormConnector::decode_body(
    std::string_view body, const JsonObjectIndex& index,
    std::optional<std::string_view> answer_params) const {
  if (form().decode_params != DecodeParams::prefill_answer || !answer_params)
    return splice_passthrough_body(body, index);
  const bool push = nixl_mode() == NixlTransferMode::push ||
                    (nixl_mode() == NixlTransferMode::automatic && answers_push(*answer_params));
  if (!push)
    return splice_decode_body(body, index, answer_params);
  auto params = nixl_push_decode_params(*answer_params);
  if (!params)
    return fail(params.error());
  return splice_decode_body(body, index, std::string_view(*params));
}

SplicedText FormConnector::decode_body(std::string_view body, const JsonObjectIndex& index,
                                       const MintedTransfer& minted) const {
  const std::string params =
      mooncake_decode_params(minted.transfer_id, minted.bootstrap_addr, minted.remote_engine_id);
  return splice_decode_body(body, index, std::string_view(params));
}

std::string FormConnector::stage_request_id(const std::string& client_id,
                                            const UpstreamSpec* prefill, const UpstreamSpec* decode,
                                            std::string_view uuid_hex) const {
  if (form().stage_id == StageIdForm::client_id)
    return client_id;
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

}  // namespace

std::unique_ptr<const KvConnector> make_kv_connector(std::string_view name,
                                                     KvConnectorOptions options) {
  if (name == "mooncake" && !options.mooncake_parallel)
    return std::make_unique<FormConnector>(kMooncakeSequential);
  for (const ConnectorForm& f : kForms) {
    if (f.name == name)
      return std::make_unique<FormConnector>(f, options.nixl_mode);
  }
  return nullptr;
}

}  // namespace pdgate
