#include <gtest/gtest.h>

#include "sim/options.hpp"

namespace pdgate::sim {
namespace {

ParseOutcome parse(std::vector<std::string> a) {
  return parse_args(a);
}

// Only --role given: every other option takes its documented default.
TEST(SimOptions, DefaultsWithRoleOnly) {
  auto r = parse({"--role", "decode"});
  ASSERT_TRUE(r.options) << r.error;
  const SimOptions& o = *r.options;
  EXPECT_EQ(o.role, SimRole::decode);
  EXPECT_EQ(o.host, "127.0.0.1");
  EXPECT_EQ(o.port, 0);
  EXPECT_EQ(o.model, "sim-model");
  EXPECT_EQ(o.advertise_host, "127.0.0.1");
  EXPECT_DOUBLE_EQ(o.prefill_us_per_token, 50);
  EXPECT_DOUBLE_EQ(o.prefill_base_ms, 2);
  EXPECT_DOUBLE_EQ(o.itl_ms, 10);
  EXPECT_EQ(o.max_num_seqs, 16u);
  EXPECT_EQ(o.max_waiting, 1024u);
  EXPECT_EQ(o.max_model_len, 32768u);
  EXPECT_EQ(o.block_size, 16u);
  EXPECT_EQ(o.kv_blocks, 8192u);
  EXPECT_TRUE(o.prefix_cache);
  EXPECT_EQ(o.default_max_tokens, 16u);
  EXPECT_DOUBLE_EQ(o.error_rate, 0);
  EXPECT_FALSE(o.die_after_chunks);
  EXPECT_FALSE(o.hang);
  EXPECT_FALSE(o.issue_decode_kv);
  EXPECT_FALSE(o.seed);
  EXPECT_EQ(o.log_level, "info");
}

// Both `--flag value` and `--flag=value` forms set the option.
TEST(SimOptions, BothValueForms) {
  auto r =
      parse({"--role=prefill", "--port", "8100", "--host=0.0.0.0", "--advertise-host", "10.0.0.5",
             "--itl-ms=2.5", "--die-after-chunks", "3", "--stall-after-chunks=9", "--seed=7",
             "--hang", "--no-prefix-cache", "--issue-decode-kv", "--error-rate", "0.25"});
  ASSERT_TRUE(r.options) << r.error;
  EXPECT_EQ(r.options->role, SimRole::prefill);
  EXPECT_EQ(r.options->port, 8100);
  EXPECT_EQ(r.options->host, "0.0.0.0");
  EXPECT_EQ(r.options->advertise_host, "10.0.0.5");
  EXPECT_DOUBLE_EQ(r.options->itl_ms, 2.5);
  EXPECT_EQ(r.options->die_after_chunks, 3u);
  EXPECT_EQ(r.options->stall_after_chunks, 9u);
  EXPECT_EQ(r.options->seed, 7u);
  EXPECT_TRUE(r.options->hang);
  EXPECT_FALSE(r.options->prefix_cache);
  EXPECT_TRUE(r.options->issue_decode_kv);
  EXPECT_DOUBLE_EQ(r.options->error_rate, 0.25);
}

// Without --role the parse fails with a message naming the flag.
TEST(SimOptions, RoleIsRequired) {
  auto r = parse({"--port", "1"});
  EXPECT_FALSE(r.options);
  EXPECT_NE(r.error.find("--role"), std::string::npos);
}

// Bad values, unknown flags and a missing value are errors, not defaults.
TEST(SimOptions, RejectsBadInput) {
  EXPECT_FALSE(parse({"--role", "router"}).options);
  EXPECT_FALSE(parse({"--role", "both", "--port", "70000"}).options);
  EXPECT_FALSE(parse({"--role", "both", "--error-rate", "1.5"}).options);
  EXPECT_FALSE(parse({"--role", "both", "--max-num-seqs", "0"}).options);
  EXPECT_FALSE(parse({"--role", "both", "--bogus"}).options);
  EXPECT_FALSE(parse({"--role", "both", "--itl-ms"}).options);
  EXPECT_FALSE(parse({"--role", "both", "--hang=maybe"}).options);
}

// KV events are off by default; the three flags set the config, the hash kind and the layout
// (current vLLM's by default).
TEST(SimOptions, KvEventFlags) {
  auto d = parse({"--role", "both"});
  ASSERT_TRUE(d.options) << d.error;
  EXPECT_FALSE(d.options->kv_events.enabled);
  EXPECT_EQ(d.options->kv_events_hash, HashKind::integer);
  EXPECT_EQ(d.options->kv_events_format, EventLayout::vllm);
  ASSERT_EQ(d.options->kv_cache_groups.size(), 1u);
  EXPECT_EQ(d.options->kv_cache_groups[0].kind, "full_attention");
  EXPECT_TRUE(d.options->lora_modules.empty());
  auto r = parse({"--role", "prefill", "--kv-events-config",
                  R"({"enable_kv_cache_events": true, "endpoint": "tcp://*:*", "topic": "t"})",
                  "--kv-events-hash=bytes", "--kv-events-format", "map"});
  ASSERT_TRUE(r.options) << r.error;
  EXPECT_TRUE(r.options->kv_events.enabled);
  EXPECT_EQ(r.options->kv_events.publisher, "zmq");
  EXPECT_EQ(r.options->kv_events.endpoint, "tcp://*:*");
  EXPECT_EQ(r.options->kv_events.topic, "t");
  EXPECT_EQ(r.options->kv_events_hash, HashKind::bytes);
  EXPECT_EQ(r.options->kv_events_format, EventLayout::map);
  auto bad = parse({"--role", "both", "--kv-events-config", R"({"endpont": "x"})"});
  EXPECT_FALSE(bad.options);
  EXPECT_NE(bad.error.find("--kv-events-config"), std::string::npos);
  EXPECT_NE(bad.error.find("endpont"), std::string::npos);
  EXPECT_FALSE(parse({"--role", "both", "--kv-events-hash", "sha"}).options);
  EXPECT_FALSE(parse({"--role", "both", "--kv-events-format", "json"}).options);
}

// --kv-cache-groups names each group's kind in order; --lora-modules adds adapters by name (the
// path is vLLM's and ignored), never the base model's name twice.
TEST(SimOptions, CacheGroupsAndLoraModules) {
  auto o = parse({"--role", "both", "--kv-cache-groups", "full_attention,mamba", "--lora-modules",
                  "ad1=/p/ad1", "--lora-modules", "ad2"});
  ASSERT_TRUE(o.options) << o.error;
  ASSERT_EQ(o.options->kv_cache_groups.size(), 2u);
  EXPECT_EQ(o.options->kv_cache_groups[1].idx, 1u);
  EXPECT_EQ(o.options->kv_cache_groups[1].kind, "mamba");
  EXPECT_EQ(o.options->lora_modules, (std::vector<std::string>{"ad1", "ad2"}));
  EXPECT_FALSE(parse({"--role", "both", "--kv-cache-groups", "full_attention,"}).options);
  EXPECT_FALSE(parse({"--role", "both", "--kv-cache-groups", "Full Attention"}).options);
  EXPECT_FALSE(parse({"--role", "both", "--lora-modules", "=/p"}).options);
  EXPECT_FALSE(parse({"--role", "both", "--lora-modules", "sim-model"}).options);
  EXPECT_FALSE(parse({"--role", "both", "--lora-modules", "a", "--lora-modules", "a=/x"}).options);
}

// --help short-circuits parsing even when other flags are invalid.
TEST(SimOptions, DataParallelSize) {
  EXPECT_EQ(parse_args({"--role", "decode"}).options->data_parallel_size, 1u);
  const auto p = parse_args({"--role", "decode", "--data-parallel-size", "4"});
  ASSERT_TRUE(p.options) << p.error;
  EXPECT_EQ(p.options->data_parallel_size, 4u);
  EXPECT_FALSE(parse_args({"--role", "decode", "--data-parallel-size", "0"}).options);
  EXPECT_FALSE(parse_args({"--role", "decode", "--data-parallel-size", "x"}).options);
}

TEST(SimOptions, Help) {
  auto r = parse({"--bogus", "--help"});
  EXPECT_FALSE(r.help);  // the unknown flag comes first and fails
  r = parse({"--help", "--bogus"});
  EXPECT_TRUE(r.help);
  EXPECT_NE(usage_text().find("--issue-decode-kv"), std::string::npos);
}

// Every fault form is parsed; items combine with commas.
TEST(SimFaultHeader, Forms) {
  auto f = parse_fault_header("error");
  EXPECT_TRUE(f.error.empty());
  EXPECT_EQ(f.fault.error_status, 500);
  f = parse_fault_header("error=503");
  EXPECT_EQ(f.fault.error_status, 503);
  f = parse_fault_header("hang");
  EXPECT_TRUE(f.fault.hang);
  f = parse_fault_header(" die-after=2 , delay-ms=150 ");
  EXPECT_TRUE(f.error.empty()) << f.error;
  EXPECT_EQ(f.fault.die_after, 2u);
  EXPECT_EQ(f.fault.delay_ms, 150u);
  f = parse_fault_header("error-after=3");
  EXPECT_EQ(f.fault.error_after, 3u);
  EXPECT_FALSE(f.fault.error_status);
  f = parse_fault_header("stall-after=4");
  EXPECT_TRUE(f.error.empty()) << f.error;
  EXPECT_EQ(f.fault.stall_after, 4u);
  EXPECT_FALSE(f.fault.die_after);
  f = parse_fault_header("stall-body=1048575");
  EXPECT_EQ(f.fault.stall_body, 1048575u);
}

// Malformed fault items are reported instead of being ignored.
TEST(SimFaultHeader, Malformed) {
  EXPECT_FALSE(parse_fault_header("explode").error.empty());
  EXPECT_FALSE(parse_fault_header("error=200").error.empty());
  EXPECT_FALSE(parse_fault_header("die-after=x").error.empty());
  EXPECT_FALSE(parse_fault_header("delay-ms").error.empty());
  EXPECT_FALSE(parse_fault_header("stall-body=-1").error.empty());
  EXPECT_FALSE(parse_fault_header("stall-after").error.empty());
  EXPECT_FALSE(parse_fault_header("stall-after=x").error.empty());
}

}  // namespace
}  // namespace pdgate::sim
