// The value parsers and printers the config files share: how an option's
// text becomes a name, a number, a duration, a size, a switch, a connector
// or a header, and how a value is written back in the syntax its flag
// takes (the effective config). Internal to core/config/; the parsers
// callers outside it use are in config.hpp.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "core/base/result.hpp"
#include "core/config/config.hpp"

namespace pdgate::config_detail {

// `name` with '_' turned into '-', the spelling the option table uses.
std::string normalize_name(std::string_view name);

// A decimal integer from 0 to `max`, nothing around it.
Result<std::uint64_t> parse_uint(std::string_view text, std::uint64_t max);

// 500ms, 10s, 1.5m, 2h or a number of seconds; at least 1ms.
Result<std::chrono::milliseconds> parse_duration(std::string_view text);

// Bytes, or a number with K, KiB, M, MiB, G or GiB; at least 1 byte.
Result<std::size_t> parse_size(std::string_view text);

// trace, debug, info, warn (or warning) or error, lower-cased.
Result<std::string> parse_log_level(std::string_view text);

// true/false, on/off, yes/no, 1/0.
Result<bool> parse_switch(std::string_view text);

// vLLM names connectors by class (NixlConnector, P2pNcclConnector,
// LMCacheConnectorV1); those names are accepted too, so a value copied from
// an engine's --kv-transfer-config works.
Result<std::string> parse_kv_connector(std::string_view text);
// One of `choices` (lowercase), case-insensitive.
Result<std::string> parse_choice(std::string_view text,
                                 std::initializer_list<std::string_view> choices);

// --kv-events URL=ENDPOINT[,replay=ENDPOINT]: the instance it is for and
// where its events come from.
Result<std::pair<std::string, KvEventsEndpoint>> parse_kv_events_flag(std::string_view text);
// --policy-log-level NAME=LEVEL: a policy's name (as in metrics: letters,
// digits, '_', '-', '.', at most 128 bytes) and a log level.
Result<std::pair<std::string, std::string>> parse_policy_log_level(std::string_view text);
// --data-parallel URL=N: the instance it is for and its number of
// data-parallel ranks (1..UpstreamSpec::kMaxDataParallelSize).
Result<std::pair<std::string, std::uint32_t>> parse_data_parallel_flag(std::string_view text);

// A header name an engine request may carry from --forward-headers or
// --set-header, lower-cased; hop-by-hop and framing headers, and those
// pdgate writes itself, are refused (a second copy would be ambiguous or
// corrupt the request).
Result<std::string> extra_header_name(std::string_view text);

// "Name: value" for --set-header.
Result<std::pair<std::string, std::string>> parse_set_header(std::string_view text);

// The printers: each writes what the matching parser reads back.
// 10s or 1500ms.
std::string duration_text(std::chrono::milliseconds d);
// A duration, or off for 0 (never).
std::string interval_text(std::chrono::milliseconds d);
// 64MiB, 1GiB, or bytes when no unit divides it.
std::string size_text(std::size_t bytes);
// true or false.
std::string bool_text(bool b);
// As a stream prints it: 0.2, 1.
std::string fraction_text(double f);

}  // namespace pdgate::config_detail
