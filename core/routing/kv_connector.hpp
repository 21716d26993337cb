// How prefill hands the KV cache to decode, one form per vLLM KV connector
// (--kv-connector, docs/protocol.md). A connector is data: which legs run
// when, what each leg's kv_transfer_params say, how params flow from
// prefill's answer (or from the gateway) to decode. The pipeline reads the
// form; the bodies are built in plugins/kv_connector.cpp from it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "core/base/json_body.hpp"
#include "core/base/json_edit.hpp"
#include "core/base/result.hpp"
#include "core/config/config.hpp"
#include "core/routing/kv_params.hpp"

namespace pdgate {

// When decode's leg is sent.
enum class LegOrder {
  one_hop,     // no prefill leg: one hop to a combined P+D instance
  sequential,  // after prefill answered (NIXL, LMCache, P2P NCCL)
  parallel,    // at the same time as prefill's (Mooncake): decode's params
               // are the gateway's own, TTFT does not wait for prefill
};

// What the prefill leg's kv_transfer_params say.
enum class PrefillParams {
  none,           // removed: the cache moves out of band (LMCache, P2P NCCL)
  export_blocks,  // "keep your blocks for a decode" (NIXL), or a previous turn's
  transfer_id,    // {do_remote_decode, do_remote_prefill:false, transfer_id} (Mooncake)
};

// Where decode's kv_transfer_params come from.
enum class DecodeParams {
  none,            // removed
  prefill_answer,  // NIXL: pull relays the answer's object unchanged; push
                   // keeps prefill's coordinates, never remote_block_ids
  gateway_minted,  // Mooncake: transfer_id, remote_bootstrap_addr, remote_engine_id
};

// The X-Request-Id both legs carry.
enum class StageIdForm {
  client_id,       // the client's (or a fresh) id
  peer_addresses,  // P2P NCCL: ___prefill_addr_P___decode_addr_D_<hex>, so
                   // decode is picked before prefill
};

// NIXL pull or push: what prefill's answer says (transfer_mode), or forced.
enum class NixlTransferMode { automatic, pull, push };

struct ConnectorForm {
  std::string_view name;
  LegOrder order = LegOrder::sequential;
  PrefillParams prefill_params = PrefillParams::none;
  DecodeParams decode_params = DecodeParams::none;
  StageIdForm stage_id = StageIdForm::client_id;
  // A decode's final params come back for the next turn's prefill
  // (multi-turn reuse, docs/conversations.md).
  bool reuses_turns = false;
};

// Mooncake's parallel legs need, per request, what the gateway minted.
struct MintedTransfer {
  std::string transfer_id;     // xfer-<32 hex>
  std::string bootstrap_addr;  // http://host:port of prefill's bootstrap server
  // From that server's /query, which answers one engine id per
  // data-parallel rank: rank 0's until legs are pinned to ranks.
  std::string remote_engine_id;
};

// A connector: its form, read by the pipeline, and the bodies built from
// it (plugins/kv_connector.cpp, the one implementation, interprets the
// form; the composition root picks it by name).
class KvConnector {
 public:
  explicit KvConnector(ConnectorForm form, NixlTransferMode nixl_mode = NixlTransferMode::automatic)
      : form_(form), nixl_mode_(nixl_mode) {}
  virtual ~KvConnector() = default;

  const ConnectorForm& form() const { return form_; }
  std::string_view name() const { return form_.name; }
  NixlTransferMode nixl_mode() const { return nixl_mode_; }
  // false: no prefill stage, one hop to a combined instance.
  bool has_prefill() const { return form_.order != LegOrder::one_hop; }
  bool parallel() const { return form_.order == LegOrder::parallel; }
  // Whether the request id names the two peers, so decode is chosen before
  // prefill (p2p-nccl).
  bool names_peers() const { return form_.stage_id == StageIdForm::peer_addresses; }
  // Whether the prefill's answer carries kv_transfer_params for decode
  // (and multi-turn reuse applies).
  bool passes_params() const { return form_.decode_params == DecodeParams::prefill_answer; }

  // The prefill's body; `kv_params_raw` is what the gateway asks the
  // prefill to do (export_blocks: NIXL's do_remote_decode or a previous
  // turn's; transfer_id: Mooncake's, from mooncake_prefill_params()).
  // Both bodies are slices of `body` plus small edits (core/base/json_body.hpp):
  // `body` must outlive them.
  virtual SplicedText prefill_body(std::string_view body, const JsonObjectIndex& index,
                                   std::string_view kv_params_raw,
                                   OneTokenFields fields = {}) const = 0;
  // The decode's body after a sequential prefill: `answer_params` is the
  // prefill's answer's params (connectors that pass them). Fails when NIXL
  // push params lack a field decode needs (vLLM's decode would raise on it).
  virtual Result<SplicedText> decode_body(std::string_view body, const JsonObjectIndex& index,
                                          std::optional<std::string_view> answer_params) const = 0;
  // The decode's body of a parallel leg (Mooncake).
  virtual SplicedText decode_body(std::string_view body, const JsonObjectIndex& index,
                                  const MintedTransfer& minted) const = 0;
  // The X-Request-Id both stages carry. `uuid_hex` is 32 fresh hex digits.
  virtual std::string stage_request_id(const std::string& client_id, const UpstreamSpec* prefill,
                                       const UpstreamSpec* decode,
                                       std::string_view uuid_hex) const = 0;

 private:
  ConnectorForm form_;
  NixlTransferMode nixl_mode_;
};

}  // namespace pdgate
