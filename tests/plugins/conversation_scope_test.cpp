// Multi-turn KV reuse is scoped to the client and to the exact history
// (issue 12): real pdgate, real pdgate-sim engines (decodes issue their own
// kv params at the end of a turn) and, for the replicas, a real
// redis-server. The prefill engine's request log says which params each
// prefill received and whether it pulled blocks; /metrics says why a turn
// missed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "core/base/sha256.hpp"
#include "tests/integration/harness.hpp"
#include "tests/plugins/redis_server.hpp"

namespace pdgate::test {
namespace {

using namespace std::chrono_literals;

const Headers kUserA = {{"Authorization", "Bearer key-of-user-a"}};
const Headers kUserB = {{"Authorization", "Bearer key-of-user-b"}};

struct Turn {
  Response response;
  std::string request_id;
  std::string answer;  // the assistant content (chat) or generated text (completions)
};

std::string answer_of(const Response& r, bool chat, bool stream) {
  if (!stream) {
    const Json c = r.json()["choices"][0];
    return chat ? c["message"].value("content", "") : c.value("text", "");
  }
  std::string text;
  for (const auto& d : sse_data(r.body)) {
    if (d == "[DONE]")
      continue;
    Json c = Json::parse(d);
    if (c["choices"].empty())
      continue;
    text +=
        chat ? c["choices"][0]["delta"].value("content", "") : c["choices"][0].value("text", "");
  }
  return text;
}

int request_counter = 0;

// Sends one chat request naming conversation `conv` with exactly `messages`.
Turn chat_turn(std::uint16_t port, const std::string& conv, const Json& messages, bool stream,
               Headers headers) {
  Turn t;
  t.request_id = conv + "-req-" + std::to_string(++request_counter);
  headers.emplace_back("X-Request-Id", t.request_id);
  const Json body = {{"model", "sim-model"},
                     {"messages", messages},
                     {"max_tokens", 4},
                     {"stream", stream},
                     {"conversation_id", conv}};
  t.response = post_json(port, "/v1/chat/completions", body, headers);
  if (t.response.status == 200)
    t.answer = answer_of(t.response, true, stream);
  return t;
}

// Sends one completions request naming conversation `conv`.
Turn completion_turn(std::uint16_t port, const std::string& conv, const std::string& prompt,
                     bool stream, Headers headers) {
  Turn t;
  t.request_id = conv + "-req-" + std::to_string(++request_counter);
  headers.emplace_back("X-Request-Id", t.request_id);
  headers.emplace_back("X-Conversation-Id", conv);
  const Json body = {
      {"model", "sim-model"}, {"prompt", prompt}, {"max_tokens", 4}, {"stream", stream}};
  t.response = post_json(port, "/v1/completions", body, headers);
  if (t.response.status == 200)
    t.answer = answer_of(t.response, false, stream);
  return t;
}

Json user(const std::string& text) {
  return {{"role", "user"}, {"content", text}};
}
Json assistant(const std::string& text) {
  return {{"role", "assistant"}, {"content", text}};
}

// `messages` followed by the turn's answer and a new question.
Json next_messages(Json messages, const Turn& t, const std::string& question) {
  messages.push_back(assistant(t.answer));
  messages.push_back(user(question));
  return messages;
}

Json prefill_record(Sim& p, const std::string& request_id) {
  for (auto& r : p.requests()) {
    if (r.value("x_request_id", Json()).is_string() && r["x_request_id"] == request_id)
      return r;
  }
  return Json();
}

// The prefill of `t` pulled the blocks decode issued for `previous`.
void expect_reused(Sim& p, const Turn& t, const Turn& previous) {
  ASSERT_EQ(t.response.status, 200) << t.response.body;
  const Json rec = prefill_record(p, t.request_id);
  ASSERT_TRUE(rec.is_object()) << "no prefill record for " << t.request_id;
  const Json kv = Json::parse(rec["body"].get<std::string>())["kv_transfer_params"];
  EXPECT_EQ(rec["kv_result"], "valid") << t.request_id << ": " << kv.dump();
  EXPECT_EQ(kv.value("remote_request_id", "").rfind("cmpl-" + previous.request_id + "-0-", 0), 0u)
      << t.request_id << " got " << kv.dump();
}

// The prefill of `t` recomputed: default params, no pull of anyone's blocks.
void expect_fresh(Sim& p, const Turn& t) {
  ASSERT_EQ(t.response.status, 200) << t.response.body;
  const Json rec = prefill_record(p, t.request_id);
  ASSERT_TRUE(rec.is_object()) << "no prefill record for " << t.request_id;
  const Json kv = Json::parse(rec["body"].get<std::string>())["kv_transfer_params"];
  EXPECT_EQ(rec["kv_result"], "none") << t.request_id;
  EXPECT_TRUE(kv["remote_host"].is_null()) << t.request_id << ": " << kv.dump();
}

// A sample of /metrics by its exact name and labels as rendered, e.g.
// `pdgate_conversation_cache_misses_total{reason="history"}`; -1 if absent.
long metric(std::uint16_t port, const std::string& sample) {
  std::istringstream in(get(port, "/metrics").body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(sample + " ", 0) == 0)
      return std::stol(line.substr(sample.size() + 1));
  }
  return -1;
}

long misses(std::uint16_t port, const std::string& reason) {
  return metric(port, "pdgate_conversation_cache_misses_total{reason=\"" + reason + "\"}");
}
long hits(std::uint16_t port) {
  return metric(port, "pdgate_conversation_cache_hits_total");
}

long pulls_served(Sim& d) {
  const Json s = d.stats()["kv_pulls_served_total"];
  long n = 0;
  for (const auto& [k, v] : s.items())
    n += v.get<long>();
  return n;
}

std::vector<std::string> gateway_args(const Sim& p, const Sim& d,
                                      std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {"--model",    "sim-model", "--prefill",
                                p.hostport(), "--decode",  d.hostport()};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::vector<std::string> decode_flags() {
  return {"--issue-decode-kv", "--itl-ms", "1"};
}

struct Cluster {
  Sim p{"prefill"};
  Sim d{"decode", decode_flags()};
};

// (1) The owner's next turn, continuing the exact history, streaming or
// not, reuses the previous turn's blocks: a hit each time.
TEST(ConversationScope, OwnerContinuesHit) {
  Cluster c;
  Gateway gw(gateway_args(c.p, c.d));
  Json m1 = Json::array({user("Hello?")});
  const Turn t1 = chat_turn(gw.port(), "conv-own", m1, true, kUserA);
  expect_fresh(c.p, t1);
  Json m2 = next_messages(m1, t1, "And then?");
  const Turn t2 = chat_turn(gw.port(), "conv-own", m2, false, kUserA);
  expect_reused(c.p, t2, t1);
  const Turn t3 = chat_turn(gw.port(), "conv-own", next_messages(m2, t2, "Last?"), true, kUserA);
  expect_reused(c.p, t3, t2);
  EXPECT_EQ(hits(gw.port()), 2);
  EXPECT_EQ(misses(gw.port(), "none"), 1);
  EXPECT_EQ(misses(gw.port(), "history"), 0);
}

// (2) Another credential naming A's conversation, even with A's exact
// history, misses without pulling A's blocks or consuming A's entry; A's
// next turn still reuses them.
TEST(ConversationScope, OtherCredentialMissesOwnerStillHits) {
  Cluster c;
  Gateway gw(gateway_args(c.p, c.d));
  Json m1 = Json::array({user("My secret plan?")});
  const Turn a1 = chat_turn(gw.port(), "conv-victim", m1, false, kUserA);
  expect_fresh(c.p, a1);
  const long served = pulls_served(c.d);
  const Json m2 = next_messages(m1, a1, "Go on.");
  const Turn b1 = chat_turn(gw.port(), "conv-victim", m2, true, kUserB);
  expect_fresh(c.p, b1);
  const Turn b2 =
      chat_turn(gw.port(), "conv-victim", Json::array({user("anything")}), false, kUserB);
  expect_fresh(c.p, b2);
  EXPECT_EQ(pulls_served(c.d), served);  // nobody pulled A's blocks
  // B's own turns stored B's own entry, not over A's: A still hits.
  const Turn a2 = chat_turn(gw.port(), "conv-victim", m2, false, kUserA);
  expect_reused(c.p, a2, a1);
  EXPECT_EQ(pulls_served(c.d), served + 1);
  EXPECT_EQ(hits(gw.port()), 1);
  // B's first turn found nothing in its own scope; its second found B's
  // own entry, made for another history.
  EXPECT_EQ(misses(gw.port(), "none"), 2);
  EXPECT_EQ(misses(gw.port(), "history"), 1);
}

// (3) Editing an earlier message: a miss, counted as a history miss.
TEST(ConversationScope, EditedEarlierMessageMisses) {
  Cluster c;
  Gateway gw(gateway_args(c.p, c.d));
  Json m1 = Json::array({{{"role", "system"}, {"content", "Be brief."}}, user("Hi?")});
  const Turn t1 = chat_turn(gw.port(), "conv-edit", m1, true, kUserA);
  Json m2 = next_messages(m1, t1, "More?");
  m2[0]["content"] = "Be verbose.";
  const Turn t2 = chat_turn(gw.port(), "conv-edit", m2, true, kUserA);
  expect_fresh(c.p, t2);
  EXPECT_EQ(misses(gw.port(), "history"), 1);
  EXPECT_EQ(hits(gw.port()), 0);
}

// (4) Regenerating (resending turn 1's messages without its answer): a
// history miss, and the regenerated turn's own answer is reusable next.
TEST(ConversationScope, RegenerateMisses) {
  Cluster c;
  Gateway gw(gateway_args(c.p, c.d));
  const Json m1 = Json::array({user("Tell me a story.")});
  const Turn t1 = chat_turn(gw.port(), "conv-regen", m1, false, kUserA);
  const Turn again = chat_turn(gw.port(), "conv-regen", m1, false, kUserA);
  expect_fresh(c.p, again);
  EXPECT_EQ(misses(gw.port(), "history"), 1);
  const Turn t2 =
      chat_turn(gw.port(), "conv-regen", next_messages(m1, again, "Next?"), true, kUserA);
  expect_reused(c.p, t2, again);
  EXPECT_EQ(hits(gw.port()), 1);
}

// (5) The assistant's content altered by the client (one character
// appended, or the message missing): history misses.
TEST(ConversationScope, AlteredAnswerMisses) {
  Cluster c;
  Gateway gw(gateway_args(c.p, c.d));
  const Json m1 = Json::array({user("Count to three.")});
  Turn t1 = chat_turn(gw.port(), "conv-alter", m1, true, kUserA);
  Turn altered = t1;
  altered.answer += "!";
  const Turn t2 =
      chat_turn(gw.port(), "conv-alter", next_messages(m1, altered, "Again?"), true, kUserA);
  expect_fresh(c.p, t2);
  // t2's own entry; the next turn skips t2's answer (user after user).
  Json m3 = m1;
  m3.push_back(user("No answer in between."));
  const Turn t3 = chat_turn(gw.port(), "conv-alter", m3, false, kUserA);
  expect_fresh(c.p, t3);
  EXPECT_EQ(misses(gw.port(), "history"), 2);
  EXPECT_EQ(hits(gw.port()), 0);
}

// (6) Completions: a prompt that begins with the previous prompt plus its
// generated text hits; one that does not misses.
TEST(ConversationScope, CompletionPromptContinuation) {
  Cluster c;
  Gateway gw(gateway_args(c.p, c.d));
  const std::string p1 = "Once upon a time";
  const Turn t1 = completion_turn(gw.port(), "conv-cmpl", p1, true, kUserA);
  expect_fresh(c.p, t1);
  const std::string p2 = p1 + t1.answer + " and then";
  const Turn t2 = completion_turn(gw.port(), "conv-cmpl", p2, false, kUserA);
  expect_reused(c.p, t2, t1);
  // Drops the last character of t2's text: no longer a continuation.
  const std::string p3 = p2 + t2.answer.substr(0, t2.answer.size() - 1) + " end";
  const Turn t3 = completion_turn(gw.port(), "conv-cmpl", p3, true, kUserA);
  expect_fresh(c.p, t3);
  EXPECT_EQ(hits(gw.port()), 1);
  EXPECT_EQ(misses(gw.port(), "history"), 1);
}

// (7) With --conversation-scope-header x-tenant-id the tenant decides: the
// same tenant with another credential continues, another tenant with the
// owner's credential does not (and does not consume the entry), and a
// request without the header gets no reuse (a scope miss).
TEST(ConversationScope, TenantHeaderDecides) {
  Cluster c;
  // Anonymous reuse off: a request without the header is then no one.
  Gateway gw(gateway_args(
      c.p, c.d,
      {"--conversation-scope-header", "x-tenant-id", "--conversation-anonymous-reuse", "false"}));
  Json m1 = Json::array({user("Tenant question?")});
  Headers t1_headers = kUserA;
  t1_headers.emplace_back("X-Tenant-Id", "tenant-1");
  const Turn t1 = chat_turn(gw.port(), "conv-tenant", m1, true, t1_headers);
  const Json m2 = next_messages(m1, t1, "Follow-up?");

  Headers other_tenant = kUserA;
  other_tenant.emplace_back("X-Tenant-Id", "tenant-2");
  const Turn x = chat_turn(gw.port(), "conv-tenant", m2, true, other_tenant);
  expect_fresh(c.p, x);
  const Turn none = chat_turn(gw.port(), "conv-tenant", m2, false, kUserA);
  expect_fresh(c.p, none);
  EXPECT_EQ(misses(gw.port(), "scope"), 1);

  Headers same_tenant = kUserB;
  same_tenant.emplace_back("X-Tenant-Id", "tenant-1");
  const Turn t2 = chat_turn(gw.port(), "conv-tenant", m2, false, same_tenant);
  expect_reused(c.p, t2, t1);
  EXPECT_EQ(hits(gw.port()), 1);
}

// Clients that name no one (no Authorization, no key) share one anonymous
// scope by default, as vLLM's multi-turn proxy reuses by conversation id
// alone: the exact-history check guards it (issue 28, item 1: before, 0 of
// the follow-up turns reused). With --conversation-anonymous-reuse false
// they get no reuse (scope misses), and the gateway's own OPENAI_API_KEY
// does not make them someone (issue 32, item 5).
TEST(ConversationScope, AnonymousClientsShareOneScopeUnlessTurnedOff) {
  Cluster c;
  {
    Gateway gw(gateway_args(c.p, c.d));
    const Json m1 = Json::array({user("Anonymous?")});
    const Turn t1 = chat_turn(gw.port(), "conv-anon", m1, false, {});
    expect_fresh(c.p, t1);
    const Turn t2 = chat_turn(gw.port(), "conv-anon", next_messages(m1, t1, "Again?"), true, {});
    expect_reused(c.p, t2, t1);
    EXPECT_EQ(hits(gw.port()), 1);
    // A stranger with another history misses: the history decides.
    const Turn x = chat_turn(gw.port(), "conv-anon", Json::array({user("Guess?")}), false, {});
    expect_fresh(c.p, x);
    EXPECT_EQ(misses(gw.port(), "history"), 1);
  }
  for (const bool default_key : {false, true}) {
    std::map<std::string, std::string> env;
    if (default_key)
      env.emplace("OPENAI_API_KEY", "gateway-key");
    Gateway gw(gateway_args(c.p, c.d, {"--conversation-anonymous-reuse", "false"}), env);
    const Json m1 = Json::array({user("Anonymous, off?")});
    const Turn t1 = chat_turn(gw.port(), "conv-anon-off", m1, false, {});
    const Turn t2 =
        chat_turn(gw.port(), "conv-anon-off", next_messages(m1, t1, "Again?"), false, {});
    expect_fresh(c.p, t2);
    EXPECT_EQ(misses(gw.port(), "scope"), 2) << "OPENAI_API_KEY set: " << default_key;
    EXPECT_EQ(hits(gw.port()), 0);
  }
}

// (8) Two replicas sharing Redis: A's next turn on the other replica hits,
// B misses on either replica; the Redis key names neither the
// conversation nor the credential; an entry in the previous version's
// format (bare params) is a miss.
TEST(ConversationScope, RedisReplicas) {
  RedisServer redis;
  Cluster c;
  Gateway gw1(gateway_args(c.p, c.d, {"--redis", redis.url()}));
  Gateway gw2(gateway_args(c.p, c.d, {"--redis", redis.url()}));
  ASSERT_TRUE(eventually([&] {
    return get(gw1.port(), "/health").json()["conversation_store"]["reachable"] == true &&
           get(gw2.port(), "/health").json()["conversation_store"]["reachable"] == true;
  }));
  Json m1 = Json::array({user("Replicated?")});
  const Turn a1 = chat_turn(gw1.port(), "conv-redis", m1, true, kUserA);
  expect_fresh(c.p, a1);
  const std::string keys = redis.cli("--raw KEYS '*'");
  EXPECT_EQ(keys.find("conv-redis"), std::string::npos) << keys;
  EXPECT_EQ(keys.find("key-of-user-a"), std::string::npos) << keys;
  // pdgate:conv: and 64 hex digits.
  EXPECT_TRUE(std::regex_search(keys, std::regex("(^|\n)pdgate:conv:[0-9a-f]{64}($|\n)"))) << keys;

  Json m2 = next_messages(m1, a1, "Still there?");
  const Turn b1 = chat_turn(gw2.port(), "conv-redis", m2, false, kUserB);
  expect_fresh(c.p, b1);
  const Turn b2 = chat_turn(gw1.port(), "conv-redis", m2, true, kUserB);
  expect_fresh(c.p, b2);
  const Turn a2 = chat_turn(gw2.port(), "conv-redis", m2, false, kUserA);
  expect_reused(c.p, a2, a1);
  EXPECT_EQ(hits(gw1.port()) + hits(gw2.port()), 1);
  EXPECT_EQ(misses(gw1.port(), "none") + misses(gw2.port(), "none"), 2);  // a1, b1
  EXPECT_EQ(misses(gw1.port(), "history"), 1);                            // b2: B's own entry

  // Replace A's new entry with what the previous version stored (the
  // bare params): A's next turn does not use it.
  std::string key;
  bool replaced = false;
  for (std::istringstream in(redis.cli("--raw KEYS 'pdgate:conv:*'")); std::getline(in, key);) {
    const Json v = Json::parse(redis.cli("--raw GET " + key));
    if (v.contains("params") &&
        v["params"].value("remote_request_id", "").find(a2.request_id) != std::string::npos) {
      const std::string bare = v["params"].dump();
      EXPECT_EQ(redis.cli("SET " + key + " '" + bare + "' EX 60"), "OK");
      replaced = true;
      break;
    }
  }
  ASSERT_TRUE(replaced) << "no entry for " << a2.request_id;
  const Turn a3 = chat_turn(gw1.port(), "conv-redis", next_messages(m2, a2, "Old?"), true, kUserA);
  expect_fresh(c.p, a3);
  EXPECT_EQ(misses(gw1.port(), "history"), 2);
}

// With --api-keys the scope is the client's key, never the credential the
// gateway forwards to the engines (OPENAI_API_KEY): tenant B naming
// tenant A's conversation with A's exact history does not read A's
// blocks, and A still continues on them (issue 32, item 5).
TEST(ConversationScope, ApiKeyTenantsDoNotShareTheGatewaysCredential) {
  Cluster c;
  const auto keys = std::filesystem::temp_directory_path() /
                    ("pdgate-scope-keys-" + std::to_string(::getpid()) + ".yaml");
  std::ofstream(keys) << "keys:\n  - name: tenant-a\n    sha256: " << *sha256_hex("sk-tenant-a")
                      << "\n  - name: tenant-b\n    sha256: " << *sha256_hex("sk-tenant-b") << "\n";
  Gateway gw(gateway_args(c.p, c.d, {"--api-keys", keys.string()}),
             {{"OPENAI_API_KEY", "gateway-key"}});
  std::filesystem::remove(keys);
  const Headers tenant_a = {{"Authorization", "Bearer sk-tenant-a"}};
  const Headers tenant_b = {{"Authorization", "Bearer sk-tenant-b"}};
  const Json m1 = Json::array({user("Tenant A's secret?")});
  const Turn a1 = chat_turn(gw.port(), "conv-keyed", m1, false, tenant_a);
  expect_fresh(c.p, a1);
  const long served = pulls_served(c.d);
  const Json m2 = next_messages(m1, a1, "Go on.");
  const Turn b1 = chat_turn(gw.port(), "conv-keyed", m2, true, tenant_b);
  expect_fresh(c.p, b1);
  EXPECT_EQ(pulls_served(c.d), served);
  EXPECT_EQ(hits(gw.port()), 0);
  const Turn a2 = chat_turn(gw.port(), "conv-keyed", m2, false, tenant_a);
  expect_reused(c.p, a2, a1);
  EXPECT_EQ(hits(gw.port()), 1);
}

}  // namespace
}  // namespace pdgate::test
