#include "sim/options.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <map>

namespace pdgate::sim {

const char* to_string(SimRole r) {
  switch (r) {
    case SimRole::prefill:
      return "prefill";
    case SimRole::decode:
      return "decode";
    case SimRole::both:
      return "both";
    case SimRole::encode:
      return "encode";
  }
  return "?";
}

namespace {

std::string trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t'))
    s.remove_suffix(1);
  return std::string(s);
}

template <typename T>
bool parse_uint(std::string_view s, T& out) {
  if (s.empty())
    return false;
  T v{};
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size())
    return false;
  out = v;
  return true;
}

bool parse_double(const std::string& s, double& out) {
  if (s.empty())
    return false;
  try {
    std::size_t used = 0;
    double v = std::stod(s, &used);
    if (used != s.size() || !std::isfinite(v))
      return false;
    out = v;
    return true;
  } catch (...) {
    return false;
  }
}

bool parse_bool(const std::string& s, bool& out) {
  if (s == "1" || s == "true" || s == "yes" || s == "on") {
    out = true;
    return true;
  }
  if (s == "0" || s == "false" || s == "no" || s == "off") {
    out = false;
    return true;
  }
  return false;
}

}  // namespace

std::string usage_text() {
  return R"(pdgate-sim: a simulated vLLM engine (OpenAI API + NIXL-like KV handshake)

Usage: pdgate-sim --role prefill|decode|both|encode [options]

  --role R                  prefill | decode | both | encode (required)
  --host H                  listen address (127.0.0.1)
  --port P                  listen port, 0 = ephemeral (0)
  --tls-cert FILE           serve https with this PEM certificate chain (needs --tls-key)
  --tls-key FILE            the PEM private key of --tls-cert
  --model NAME              served model name (sim-model)
  --engine-id ID            engine id put in kv params (random UUID)
  --advertise-host H        remote_host put in kv params (= --host)
  --prefill-us-per-token U  prefill cost per uncached prompt token, microseconds (50)
  --prefill-base-ms M       fixed cost of every prefill, milliseconds (2)
  --itl-ms M                time per output token, milliseconds (10)
  --max-num-seqs N          requests running at once; the rest queue FIFO (16)
  --max-waiting N           queued requests beyond which the sim answers 503 (1024)
  --max-model-len N         longest prompt + max_tokens accepted (32768)
  --block-size N            tokens per KV block (16)
  --kv-blocks N             KV blocks: prefix cache capacity and usage denominator (8192)
  --no-prefix-cache         disable prefix caching
  --default-max-tokens N    output tokens when the request names none (16)
  --error-rate P            fraction of completion requests answered 500 (0.0)
  --die-after-chunks N      streaming: close the socket after N data events
  --stall-after-chunks N    streaming: after N data events send nothing more, the
                            connection left open (a hung engine)
  --hang                    read requests and never answer (except /sim/*)
  --no-profile              /start_profile and /stop_profile answer 404, as vLLM does
                            without VLLM_TORCH_PROFILER_DIR
  --issue-decode-kv         finished non-prefill requests issue kv params
  --enable-prompt-tokens-details
                            usage reports prompt_tokens_details.cached_tokens (when
                            non-zero), as vLLM's flag of that name
  --seed N                  seed for the fault RNG and generated ids
  --kv-connector K          nixl|mooncake|p2p-nccl|lmcache|none (nixl); mooncake: GET /query
                            answers the engine id (the bootstrap server); other than nixl
                            and mooncake, requests
                            carrying kv_transfer_params are refused (400); p2p-nccl
                            prefill/decode also need a ___prefill_addr_..._{hex} id
  --log-level L             trace|debug|info|warn|error|off (info)
  --kv-pull-ms M            fixed cost of a successful KV pull on decode (1)
  --kv-pull-timeout-ms N    timeout of the whole pull HTTP exchange (2000)
  --kv-expiry-s N           kv params a decode issues (--issue-decode-kv) expire after
                            N seconds (480)
  --kv-lease-ms N           kv params a prefill issues expire after N ms, as vLLM's
                            kv_lease_duration (30000)
  --kv-transfer-mode M      pull|push (pull): NixlPullConnector or NixlPushConnector; a
                            prefill answers transfer_mode M, a push decode needs
                            remote_engine_id, remote_request_id, remote_host,
                            remote_port and tp_size (500 without) and registers
  --kv-params-drop FIELD    fault: leave FIELD out of the kv params a prefill issues
  --kv-wait-ms N            mooncake: how long a decode leg waits for prefill's KV
                            under its transfer_id before failing the request (480000)
  --prefill-lanes N         prefills computed concurrently, 0 = unlimited (1)
  --data-parallel-size N    engine cores behind this API server, as vLLM's data
                            parallelism (1): each has its own scheduler, prefix cache,
                            engine id (<id>_dp<rank>) and KV-event socket (endpoint
                            port + rank); an X-data-parallel-rank header pins a
                            request to one (400 when out of range), else the least
                            busy core serves it; /metrics has one series per core
  --kv-events-config JSON   vLLM's KV cache events: {"enable_kv_cache_events": true,
                            "publisher": "zmq", "endpoint": "tcp://*:5557",
                            "replay_endpoint": "tcp://*:5558", "buffer_steps": 10000,
                            "hwm": 100000, "max_queue_size": 100000, "topic": ""};
                            a port of * binds an ephemeral port (logged at startup,
                            and in /sim/stats)
  --kv-events-hash H        int|bytes: block hashes as integers or 32-byte values (int)
  --kv-events-format F      vllm|array|map: msgpack layout of batches and events: as
                            current vLLM (positional batch, events as maps with
                            group_idx, kv_cache_spec_kind, extra_keys), as older vLLMs
                            (all positional, no group fields), or all maps (vllm)
  --kv-cache-groups K,K     the model's KV-cache groups by kind (full_attention,
                            sliding_window, mamba, ...); each group's blocks are
                            published on their own (full_attention)
  --lora-modules NAME[=PATH]  serve a LoRA adapter too (repeatable): requests naming
                            it are served and their blocks published with lora_name
  --help                    print this text

Flags take `--flag value` or `--flag=value`; boolean flags also accept
`--flag=true|false`.
)";
}

ParseOutcome parse_args(const std::vector<std::string>& args) {
  ParseOutcome out;
  SimOptions o;
  bool role_set = false;

  using Setter = std::function<std::string(const std::string&)>;
  auto size_flag = [](std::size_t& dst, std::size_t min) -> Setter {
    return [&dst, min](const std::string& v) -> std::string {
      std::size_t x = 0;
      if (!parse_uint(v, x))
        return "expects a non-negative integer";
      if (x < min)
        return "must be at least " + std::to_string(min);
      dst = x;
      return {};
    };
  };
  // A count that stays unset unless given (a fault armed by its flag).
  auto optional_size_flag = [](std::optional<std::size_t>& dst) -> Setter {
    return [&dst](const std::string& v) -> std::string {
      std::size_t n = 0;
      if (!parse_uint(v, n))
        return "expects a non-negative integer";
      dst = n;
      return {};
    };
  };
  auto double_flag = [](double& dst, double min, double max) -> Setter {
    return [&dst, min, max](const std::string& v) -> std::string {
      double x = 0;
      if (!parse_double(v, x))
        return "expects a number";
      if (x < min || x > max) {
        return "must be within [" + std::to_string(min) + ", " + std::to_string(max) + "]";
      }
      dst = x;
      return {};
    };
  };
  auto string_flag = [](std::string& dst) -> Setter {
    return [&dst](const std::string& v) -> std::string {
      if (v.empty())
        return "expects a non-empty value";
      dst = v;
      return {};
    };
  };

  // One of a few names, each standing for a value of E.
  auto choice_flag = []<typename E>(E& dst,
                                    std::vector<std::pair<std::string, E>> choices) -> Setter {
    return [&dst, choices = std::move(choices)](const std::string& v) -> std::string {
      std::string names;
      for (const auto& [name, value] : choices) {
        if (v == name) {
          dst = value;
          return {};
        }
        names += (names.empty() ? "" : "|") + name;
      }
      return "expects " + names;
    };
  };

  const std::map<std::string, Setter> valued = {
      {"--role",
       [&](const std::string& v) -> std::string {
         if (v == "prefill") {
           o.role = SimRole::prefill;
         } else if (v == "decode") {
           o.role = SimRole::decode;
         } else if (v == "both") {
           o.role = SimRole::both;
         } else if (v == "encode") {
           o.role = SimRole::encode;
         } else {
           return "expects prefill|decode|both|encode";
         }
         role_set = true;
         return {};
       }},
      {"--host", string_flag(o.host)},
      {"--port",
       [&](const std::string& v) -> std::string {
         std::uint32_t p = 0;
         if (!parse_uint(v, p) || p > 65535)
           return "expects a port number 0..65535";
         o.port = static_cast<std::uint16_t>(p);
         return {};
       }},
      {"--tls-cert", string_flag(o.tls_cert)},
      {"--tls-key", string_flag(o.tls_key)},
      {"--model", string_flag(o.model)},
      {"--engine-id", string_flag(o.engine_id)},
      {"--advertise-host", string_flag(o.advertise_host)},
      {"--prefill-us-per-token", double_flag(o.prefill_us_per_token, 0, 1e9)},
      {"--prefill-base-ms", double_flag(o.prefill_base_ms, 0, 1e9)},
      {"--itl-ms", double_flag(o.itl_ms, 0, 1e9)},
      {"--max-num-seqs", size_flag(o.max_num_seqs, 1)},
      {"--max-waiting", size_flag(o.max_waiting, 0)},
      {"--max-model-len", size_flag(o.max_model_len, 1)},
      {"--block-size", size_flag(o.block_size, 1)},
      {"--kv-blocks", size_flag(o.kv_blocks, 1)},
      {"--default-max-tokens", size_flag(o.default_max_tokens, 1)},
      {"--error-rate", double_flag(o.error_rate, 0, 1)},
      {"--die-after-chunks", optional_size_flag(o.die_after_chunks)},
      {"--stall-after-chunks", optional_size_flag(o.stall_after_chunks)},
      {"--seed",
       [&](const std::string& v) -> std::string {
         std::uint64_t s = 0;
         if (!parse_uint(v, s))
           return "expects a non-negative integer";
         o.seed = s;
         return {};
       }},
      {"--log-level",
       [&](const std::string& v) -> std::string {
         static const char* const kLevels[] = {"trace", "debug",    "info", "warn",
                                               "error", "critical", "off"};
         for (const char* l : kLevels) {
           if (v == l) {
             o.log_level = v;
             return {};
           }
         }
         return "expects trace|debug|info|warn|error|critical|off";
       }},
      {"--kv-connector",
       [&](const std::string& v) -> std::string {
         if (v != "nixl" && v != "mooncake" && v != "p2p-nccl" && v != "lmcache" && v != "none")
           return "expects nixl|mooncake|p2p-nccl|lmcache|none";
         o.kv_connector = v;
         return {};
       }},
      {"--kv-pull-ms", double_flag(o.kv_pull_ms, 0, 1e9)},
      {"--kv-pull-timeout-ms", size_flag(o.kv_pull_timeout_ms, 1)},
      {"--kv-expiry-s", size_flag(o.kv_expiry_s, 1)},
      {"--kv-lease-ms", size_flag(o.kv_lease_ms, 1)},
      {"--kv-wait-ms", size_flag(o.kv_wait_ms, 1)},
      {"--kv-transfer-mode",
       [&](const std::string& v) -> std::string {
         if (v != "pull" && v != "push")
           return "expects pull|push";
         o.kv_transfer_mode = v;
         return {};
       }},
      {"--kv-params-drop", string_flag(o.kv_params_drop)},
      {"--prefill-lanes", size_flag(o.prefill_lanes, 0)},
      {"--data-parallel-size", size_flag(o.data_parallel_size, 1)},
      {"--kv-events-config",
       [&](const std::string& v) -> std::string {
         KvEventsConfigParse p = parse_kv_events_config(v);
         if (!p.config)
           return p.error;
         o.kv_events = std::move(*p.config);
         return {};
       }},
      {"--kv-events-hash",
       choice_flag(o.kv_events_hash, {{"int", HashKind::integer}, {"bytes", HashKind::bytes}})},
      {"--kv-events-format", choice_flag(o.kv_events_format, {{"vllm", EventLayout::vllm},
                                                              {"array", EventLayout::array},
                                                              {"map", EventLayout::map}})},
      {"--kv-cache-groups",
       [&](const std::string& v) -> std::string {
         std::vector<CacheGroup> groups;
         std::size_t from = 0;
         while (from <= v.size()) {
           const std::size_t comma = std::min(v.find(',', from), v.size());
           const std::string kind = v.substr(from, comma - from);
           if (kind.empty() || kind.size() > 64 ||
               kind.find_first_not_of("abcdefghijklmnopqrstuvwxyz_") != std::string::npos)
             return "expects KIND[,KIND...], each a vLLM KVCacheSpecKind (full_attention, "
                    "sliding_window, mamba, ...)";
           groups.push_back({static_cast<std::uint32_t>(groups.size()), kind});
           from = comma + 1;
         }
         o.kv_cache_groups = std::move(groups);
         return {};
       }},
      {"--lora-modules",
       [&](const std::string& v) -> std::string {
         // vLLM's NAME=PATH (the path is not read: the sim has no weights).
         const std::string name = v.substr(0, v.find('='));
         if (name.empty())
           return "expects NAME[=PATH]";
         if (name == o.model ||
             std::find(o.lora_modules.begin(), o.lora_modules.end(), name) != o.lora_modules.end())
           return "names a model already served";
         o.lora_modules.push_back(name);
         return {};
       }},
  };
  const std::map<std::string, bool*> booleans = {
      {"--hang", &o.hang},
      {"--issue-decode-kv", &o.issue_decode_kv},
      {"--no-profile", &o.no_profile},
      {"--enable-prompt-tokens-details", &o.enable_prompt_tokens_details},
  };

  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      out.help = true;
      return out;
    }
    std::string name = arg;
    std::optional<std::string> value;
    if (auto eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    }
    if (name == "--no-prefix-cache") {
      bool b = true;
      if (value && !parse_bool(*value, b)) {
        out.error = "--no-prefix-cache expects true|false";
        return out;
      }
      o.prefix_cache = !b;
      continue;
    }
    if (auto it = booleans.find(name); it != booleans.end()) {
      bool b = true;
      if (value && !parse_bool(*value, b)) {
        out.error = name + " expects true|false";
        return out;
      }
      *it->second = b;
      continue;
    }
    auto it = valued.find(name);
    if (it == valued.end()) {
      out.error = "unknown argument: " + arg;
      return out;
    }
    if (!value) {
      if (i + 1 >= args.size()) {
        out.error = name + " needs a value";
        return out;
      }
      value = args[++i];
    }
    if (std::string err = it->second(*value); !err.empty()) {
      out.error = name + " " + err + " (got '" + *value + "')";
      return out;
    }
  }
  if (!role_set) {
    out.error = "--role is required (prefill|decode|both|encode)";
    return out;
  }
  if (o.advertise_host.empty())
    o.advertise_host = o.host;
  out.options = std::move(o);
  return out;
}

FaultParse parse_fault_header(std::string_view value) {
  FaultParse out;
  std::size_t start = 0;
  while (start <= value.size()) {
    std::size_t comma = value.find(',', start);
    if (comma == std::string_view::npos)
      comma = value.size();
    std::string item = trim(value.substr(start, comma - start));
    start = comma + 1;
    if (item.empty()) {
      if (comma >= value.size())
        break;
      continue;
    }
    std::string key = item;
    std::string arg;
    bool has_arg = false;
    if (auto eq = item.find('='); eq != std::string::npos) {
      key = trim(std::string_view(item).substr(0, eq));
      arg = trim(std::string_view(item).substr(eq + 1));
      has_arg = true;
    }
    if (key == "error") {
      int status = 500;
      if (has_arg && (!parse_uint(arg, status) || status < 400 || status > 599)) {
        out.error = "X-Sim-Fault: error=N expects a status 400..599";
        return out;
      }
      out.fault.error_status = status;
    } else if (key == "hang" && !has_arg) {
      out.fault.hang = true;
    } else if (key == "die-after" && has_arg) {
      std::size_t n = 0;
      if (!parse_uint(arg, n)) {
        out.error = "X-Sim-Fault: die-after=N expects a non-negative integer";
        return out;
      }
      out.fault.die_after = n;
    } else if (key == "stall-after" && has_arg) {
      std::size_t n = 0;
      if (!parse_uint(arg, n)) {
        out.error = "X-Sim-Fault: stall-after=N expects a non-negative integer";
        return out;
      }
      out.fault.stall_after = n;
    } else if (key == "error-after" && has_arg) {
      std::size_t n = 0;
      if (!parse_uint(arg, n)) {
        out.error = "X-Sim-Fault: error-after=N expects a non-negative integer";
        return out;
      }
      out.fault.error_after = n;
    } else if (key == "delay-ms" && has_arg) {
      std::size_t n = 0;
      if (!parse_uint(arg, n)) {
        out.error = "X-Sim-Fault: delay-ms=N expects a non-negative integer";
        return out;
      }
      out.fault.delay_ms = n;
    } else if (key == "interim" && has_arg) {
      std::size_t n = 0;
      if (!parse_uint(arg, n) || n > 1000) {
        out.error = "X-Sim-Fault: interim=N expects an integer 0..1000";
        return out;
      }
      out.fault.interim = n;
    } else if (key == "stall-body" && has_arg) {
      std::size_t n = 0;
      if (!parse_uint(arg, n)) {
        out.error = "X-Sim-Fault: stall-body=N expects a non-negative integer";
        return out;
      }
      out.fault.stall_body = n;
    } else {
      out.error = "X-Sim-Fault: unknown item '" + item +
                  "' (expected error, error=NNN, hang, die-after=N, stall-after=N, "
                  "error-after=N, delay-ms=N, interim=N, stall-body=N)";
      return out;
    }
  }
  return out;
}

}  // namespace pdgate::sim
