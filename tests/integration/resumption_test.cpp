// Streams whose decode breaks off mid-answer are resumed on another decode
// (docs/resumption.md): real pdgate and pdgate-sim processes, the client's
// stream checked as a client would read it.
#include <signal.h>

#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/admin_gateway.hpp"
#include "tests/integration/harness.hpp"

namespace pdgate::test {
namespace {

// pdgate-sim's answer: fixed words by position (sim/tokenizer.cpp).
std::string sim_answer(int tokens) {
  static const char* kWords[] = {"the",  "quick", "brown",  "fox", "jumps", "over",
                                 "lazy", "dog",   "pack",   "my",  "box",   "with",
                                 "five", "dozen", "liquor", "jugs"};
  std::string s;
  for (int i = 0; i < tokens; ++i)
    s += std::string(" ") + kWords[i % 16];
  return s;
}

Json chat_body(int max_tokens, bool usage) {
  Json b = {{"model", "sim-model"},
            {"messages", {{{"role", "user"}, {"content", "Tell me a story"}}}},
            {"max_tokens", max_tokens},
            {"stream", true}};
  if (usage)
    b["stream_options"] = {{"include_usage", true}};
  return b;
}

Json completion_body(int max_tokens, bool usage) {
  Json b = {{"model", "sim-model"},
            {"prompt", "Once upon a time"},
            {"max_tokens", max_tokens},
            {"stream", true}};
  if (usage)
    b["stream_options"] = {{"include_usage", true}};
  return b;
}

// A client's reading of a stream: its text, and everything wrong with its
// SSE sequence (empty when it is one engine's valid answer).
struct Read {
  std::string text;
  std::string problems;
  std::optional<Json> usage;
  int role_chunks = 0;
};

Read read_stream(const Response& r, bool chat) {
  Read out;
  auto problem = [&](const std::string& p) { out.problems += p + "; "; };
  if (r.status != 200)
    problem("status " + std::to_string(r.status));
  const auto events = sse_data(r.body);
  if (events.empty() || events.back() != "[DONE]")
    problem("does not end with [DONE]");
  std::string id;
  Json created;
  int done = 0;
  for (std::size_t i = 0; i < events.size(); ++i) {
    if (events[i] == "[DONE]") {
      ++done;
      continue;
    }
    const Json e = Json::parse(events[i], nullptr, false);
    if (e.is_discarded() || !e.is_object()) {
      problem("not JSON: " + events[i]);
      continue;
    }
    if (e.contains("error")) {
      problem("error event: " + events[i]);
      continue;
    }
    if (id.empty()) {
      id = e.value("id", "");
      created = e["created"];
    } else if (e.value("id", "") != id || e["created"] != created) {
      problem("envelope changed at event " + std::to_string(i) + ": " + events[i]);
    }
    if (e.contains("usage") && !e["usage"].is_null()) {
      out.usage = e["usage"];
      if (i + 2 != events.size())
        problem("usage is not the last event before [DONE]");
    }
    for (const auto& c : e["choices"]) {
      if (chat) {
        const Json& d = c["delta"];
        if (d.contains("role")) {
          ++out.role_chunks;
          if (i != 0)
            problem("role chunk at event " + std::to_string(i));
        }
        if (d.contains("content") && d["content"].is_string())
          out.text += d["content"].get<std::string>();
      } else if (c.contains("text")) {
        out.text += c["text"].get<std::string>();
      }
    }
  }
  if (done != 1)
    problem(std::to_string(done) + " [DONE]");
  if (chat && out.role_chunks != 1)
    problem(std::to_string(out.role_chunks) + " role chunks");
  return out;
}

double migrations(std::uint16_t port, const std::string& reason, const std::string& outcome) {
  return metric_sample(port, "pdgate_decode_migrations_total",
                       "reason=\"" + reason + "\",outcome=\"" + outcome + "\"");
}

// Requests until one's first leg went to `dying` (round-robin alternates
// the two decodes); returns the responses, all of which must be whole.
std::vector<Response> until_one_breaks(Gateway& gw, Sim& dying, const std::string& target,
                                       const Json& body) {
  std::vector<Response> out;
  for (int i = 0; i < 4 && dying.requests().empty(); ++i)
    out.push_back(post_json(gw.port(), target, body));
  return out;
}

// A streamed chat whose decode dies after 5 events: the client's stream
// is one valid answer equal to the uninterrupted one (one role chunk, one
// [DONE], usage last and summing both legs), and the migration is counted.
TEST(Resumption, StreamedChatContinuesOnAnotherDecode) {
  Sim p("prefill");
  Sim dying("decode", {"--die-after-chunks", "5", "--itl-ms", "2"});
  Sim healthy("decode", {"--itl-ms", "2"});
  Gateway gw({"--prefill", p.hostport(), "--decode", dying.hostport(), healthy.hostport()});
  const auto responses = until_one_breaks(gw, dying, "/v1/chat/completions", chat_body(12, true));
  ASSERT_FALSE(dying.requests().empty());
  for (const auto& r : responses) {
    const Read got = read_stream(r, true);
    EXPECT_EQ(got.problems, "") << r.body;
    EXPECT_EQ(got.text, sim_answer(12)) << r.body;
    ASSERT_TRUE(got.usage) << r.body;
    EXPECT_EQ((*got.usage)["completion_tokens"], 12) << r.body;
    // The sim counts 4 bytes a token: "user" + "Tell me a story" is 19.
    EXPECT_EQ((*got.usage)["prompt_tokens"], 5) << r.body;
    EXPECT_EQ((*got.usage)["total_tokens"], 17) << r.body;
  }
  EXPECT_EQ(migrations(gw.port(), "reset", "resumed"), 1);
  // The resumed leg carried the lineage id and the continuation.
  const Json legs = healthy.requests();
  bool continued = false;
  for (const auto& leg : legs) {
    const std::string id = leg.value("request_id", "");
    if (id.size() > 3 && id.ends_with("-r1"))
      continued = true;
  }
  EXPECT_TRUE(continued) << legs.dump();
}

// The same for a completion: its prompt is extended by the answer so far.
TEST(Resumption, StreamedCompletionContinuesOnAnotherDecode) {
  Sim p("prefill");
  Sim dying("decode", {"--die-after-chunks", "3", "--itl-ms", "2"});
  Sim healthy("decode", {"--itl-ms", "2"});
  const std::string log = "/tmp/pdgate-resumption-" + std::to_string(getpid()) + ".log";
  Gateway gw({"--prefill", p.hostport(), "--decode", dying.hostport(), healthy.hostport(),
              "--access-log", log, "--access-log-format", "json"});
  const auto responses = until_one_breaks(gw, dying, "/v1/completions", completion_body(9, false));
  ASSERT_FALSE(dying.requests().empty());
  for (const auto& r : responses) {
    const Read got = read_stream(r, false);
    EXPECT_EQ(got.problems, "") << r.body;
    EXPECT_EQ(got.text, sim_answer(9)) << r.body;
    EXPECT_FALSE(got.usage) << "the client did not ask for usage: " << r.body;
  }
  EXPECT_EQ(migrations(gw.port(), "reset", "resumed"), 1);
  // The access log names the resumed request's legs.
  std::vector<Json> lines;
  ASSERT_TRUE(eventually([&] {
    lines.clear();
    std::ifstream in(log);
    for (std::string line; std::getline(in, line);)
      lines.push_back(Json::parse(line, nullptr, false));
    return lines.size() == responses.size();
  })) << lines.size();
  int resumed = 0;
  for (const auto& l : lines) {
    if (l["migrations"] == 1) {
      ++resumed;
      EXPECT_EQ(l["migrated_from"], dying.url()) << l.dump();
      EXPECT_EQ(l["decode"], healthy.url()) << l.dump();
      EXPECT_EQ(l["status"], 200) << l.dump();
    } else {
      EXPECT_EQ(l["migrations"], 0) << l.dump();
      EXPECT_EQ(l["migrated_from"], nullptr) << l.dump();
    }
  }
  EXPECT_EQ(resumed, 1);
  std::remove(log.c_str());
}

// A stream that carries token ids (the client asked for return_token_ids)
// is resumed token-exact: the resumed leg is a completion whose prompt is
// the prompt's ids followed by the answer's, as the engine counted them
// (a chat stream's leg goes to /v1/completions and its events come back
// as chat chunks). The client's stream is one answer, its token ids
// continuing without a gap or a repeat.
TEST(Resumption, TokenIdsResumeTokenExact) {
  Sim p("prefill");
  Sim dying("decode", {"--die-after-chunks", "4", "--itl-ms", "2"});
  Sim healthy("decode", {"--itl-ms", "2"});
  Gateway gw({"--prefill", p.hostport(), "--decode", dying.hostport(), healthy.hostport()});
  for (const bool chat : {true, false}) {
    SCOPED_TRACE(chat ? "chat" : "completions");
    Json body = chat ? chat_body(10, true) : completion_body(10, true);
    body["return_token_ids"] = true;
    const std::size_t legs_before = healthy.requests().size();
    const std::size_t dead_before = dying.requests().size();
    std::vector<Response> responses;
    Json client_prompt_ids;
    for (int i = 0; i < 4 && dying.requests().size() == dead_before; ++i)
      responses.push_back(
          post_json(gw.port(), chat ? "/v1/chat/completions" : "/v1/completions", body));
    ASSERT_GT(dying.requests().size(), dead_before);
    for (const auto& r : responses) {
      const Read got = read_stream(r, chat);
      EXPECT_EQ(got.problems, "") << r.body;
      EXPECT_EQ(got.text, sim_answer(10)) << r.body;
      ASSERT_TRUE(got.usage) << r.body;
      EXPECT_EQ((*got.usage)["completion_tokens"], 10) << r.body;
      // The answer's ids, in order: 0xFFFF0000 + position, each once; the
      // prompt's ids once, in the first events.
      std::vector<std::uint32_t> ids;
      int prompt_ids = 0;
      for (const auto& ev : sse_data(r.body)) {
        const Json e = Json::parse(ev, nullptr, false);
        if (!e.is_object())
          continue;
        prompt_ids += e.contains("prompt_token_ids");
        if (e.contains("prompt_token_ids"))
          client_prompt_ids = e["prompt_token_ids"];
        for (const auto& c : e["choices"]) {
          prompt_ids += c.contains("prompt_token_ids");
          if (c.contains("prompt_token_ids"))
            client_prompt_ids = c["prompt_token_ids"];
          for (const auto& id : c.value("token_ids", Json::array()))
            ids.push_back(id.get<std::uint32_t>());
        }
      }
      EXPECT_EQ(prompt_ids, 1) << r.body;
      ASSERT_EQ(ids.size(), 10u) << r.body;
      for (std::uint32_t i = 0; i < 10; ++i)
        EXPECT_EQ(ids[i], 0xFFFF0000u + i) << r.body;
    }
    // The resumed leg: a completion of token ids ending with the tokens
    // the client had (the dying decode sends 4 events: a chat's first is
    // its role chunk), the rest left to generate.
    const std::size_t had = chat ? 3 : 4;
    const Json legs = healthy.requests();
    bool token_leg = false;
    for (std::size_t i = legs_before; i < legs.size(); ++i) {
      const Json& leg = legs[i];
      if (!leg.value("request_id", "").ends_with("-r1"))
        continue;
      EXPECT_EQ(leg["path"], "/v1/completions") << leg.dump();
      const Json sent = Json::parse(leg.value("body", ""), nullptr, false);
      ASSERT_TRUE(sent.is_object()) << leg.dump();
      ASSERT_TRUE(sent["prompt"].is_array()) << sent.dump();
      const auto& prompt = sent["prompt"];
      ASSERT_GT(prompt.size(), had) << sent.dump();
      for (std::size_t k = 0; k < had; ++k)
        EXPECT_EQ(prompt[prompt.size() - had + k], 0xFFFF0000u + k) << sent.dump();
      Json own = Json::array();
      for (std::size_t k = 0; k + had < prompt.size(); ++k)
        own.push_back(prompt[k]);
      EXPECT_EQ(own, client_prompt_ids) << "the prompt's own ids come first: " << sent.dump();
      EXPECT_EQ(sent["max_tokens"], 10 - had) << sent.dump();
      EXPECT_FALSE(sent.contains("messages")) << sent.dump();
      token_leg = true;
    }
    EXPECT_TRUE(token_leg) << legs.dump();
  }
  EXPECT_EQ(migrations(gw.port(), "reset", "resumed"), 2);
}

// --resume-token-ids: the gateway asks for the ids itself, so streams of
// clients that did not ask resume token-exact too, and those clients'
// streams carry no ids: byte for byte what they get without the flag,
// apart from the envelope.
TEST(Resumption, AskedTokenIdsAreKeptFromTheClient) {
  Sim p("prefill");
  Sim dying("decode", {"--die-after-chunks", "4", "--itl-ms", "2"});
  Sim healthy("decode", {"--itl-ms", "2"});
  Gateway gw({"--prefill", p.hostport(), "--decode", dying.hostport(), healthy.hostport(),
              "--resume-token-ids", "true"});
  const auto responses = until_one_breaks(gw, dying, "/v1/chat/completions", chat_body(10, false));
  ASSERT_FALSE(dying.requests().empty());
  for (const auto& r : responses) {
    const Read got = read_stream(r, true);
    EXPECT_EQ(got.problems, "") << r.body;
    EXPECT_EQ(got.text, sim_answer(10)) << r.body;
    EXPECT_EQ(r.body.find("token_ids"), std::string::npos) << r.body;
  }
  // The engines were asked; the resumed leg was a completion of ids.
  const Json first = dying.requests()[0];
  EXPECT_EQ(Json::parse(first.value("body", ""))["return_token_ids"], true) << first.dump();
  bool token_leg = false;
  for (const auto& leg : healthy.requests()) {
    if (!leg.value("request_id", "").ends_with("-r1"))
      continue;
    EXPECT_EQ(leg["path"], "/v1/completions") << leg.dump();
    const Json sent = Json::parse(leg.value("body", ""));
    EXPECT_TRUE(sent["prompt"].is_array()) << sent.dump();
    EXPECT_EQ(sent["return_token_ids"], true) << sent.dump();
    token_leg = true;
  }
  EXPECT_TRUE(token_leg);
  // An uninterrupted stream with the flag is the one without it, but for
  // its envelope (id, created).
  Sim single("both");
  Gateway with({"--decode", single.hostport(), "--prefill-servers-urls", "disable",
                "--resume-token-ids", "true"});
  Gateway without({"--decode", single.hostport(), "--prefill-servers-urls", "disable"});
  auto events = [](const Response& r) {
    std::vector<Json> out;
    for (const auto& e : sse_data(r.body)) {
      Json j = Json::parse(e, nullptr, false);
      if (j.is_object()) {
        j.erase("id");
        j.erase("created");
      } else {
        j = e;  // [DONE]
      }
      out.push_back(j);
    }
    return out;
  };
  for (const bool chat : {true, false}) {
    const std::string target = chat ? "/v1/chat/completions" : "/v1/completions";
    const Json body = chat ? chat_body(5, true) : completion_body(5, true);
    EXPECT_EQ(events(post_json(with.port(), target, body)),
              events(post_json(without.port(), target, body)));
  }
}

// vLLM's mid-stream error event (here on every leg, after 3 events: the
// fault header reaches every decode) is kept from the client and the
// stream resumed, leg after leg, until the answer is whole.
TEST(Resumption, ErrorEventsAreResumedLegAfterLeg) {
  Sim p("prefill");
  Sim d1("decode", {"--itl-ms", "2"});
  Sim d2("decode", {"--itl-ms", "2"});
  Gateway gw({"--prefill", p.hostport(), "--decode", d1.hostport(), d2.hostport(),
              "--forward-headers", "x-sim-fault", "--decode-migrations", "3"});
  auto r = post_json(gw.port(), "/v1/chat/completions", chat_body(6, false),
                     {{"X-Sim-Fault", "error-after=3"}});
  const Read got = read_stream(r, true);
  EXPECT_EQ(got.problems, "") << r.body;
  EXPECT_EQ(got.text, sim_answer(6)) << r.body;
  // Legs of 2 tokens each: the third ends with its finish_reason before
  // the error event, which completes the answer.
  EXPECT_EQ(migrations(gw.port(), "error_event", "resumed"), 2);
}

// --decode-migrations 0: the client gets today's in-band error event and
// no [DONE]; the break is counted as refused.
TEST(Resumption, DisabledGivesTheErrorEvent) {
  Sim p("prefill");
  Sim dying("decode", {"--die-after-chunks", "3", "--itl-ms", "2"});
  Sim healthy("decode", {"--die-after-chunks", "3", "--itl-ms", "2"});
  Gateway gw({"--prefill", p.hostport(), "--decode", dying.hostport(), healthy.hostport(),
              "--decode-migrations", "0"});
  auto r = post_json(gw.port(), "/v1/chat/completions", chat_body(20, false));
  ASSERT_EQ(r.status, 200);
  const auto events = sse_data(r.body);
  ASSERT_EQ(events.size(), 4u) << r.body;
  const Json err = Json::parse(events.back());
  ASSERT_TRUE(err.contains("error")) << r.body;
  EXPECT_EQ(err["error"]["code"], 502);
  EXPECT_EQ(r.body.find("[DONE]"), std::string::npos);
  EXPECT_EQ(migrations(gw.port(), "reset", "refused"), 1);
  EXPECT_EQ(migrations(gw.port(), "reset", "resumed"), 0);
}

// A policy opts out: its decode pick refuses when ctx.migrations is set
// (a plain nil would fall back to round-robin), and the client gets the
// error event.
TEST(Resumption, PolicyOptsOutWithCtxMigrations) {
  Sim p("prefill");
  Sim dying("decode", {"--die-after-chunks", "3", "--itl-ms", "2"});
  Sim healthy("decode", {"--itl-ms", "2"});
  EditedFile policy("no_resume.lua", R"(
return { pick = function(ctx, instances)
  if ctx.migrations > 0 then return nil, 503, "no resuming" end
  return instances[1]
end }
)");
  Gateway gw({"--prefill", p.hostport(), "--decode", dying.hostport(), healthy.hostport(),
              "--policy-decode", policy.path()});
  auto r = post_json(gw.port(), "/v1/chat/completions", chat_body(20, false));
  ASSERT_EQ(r.status, 200);
  const auto events = sse_data(r.body);
  ASSERT_FALSE(events.empty());
  EXPECT_TRUE(Json::parse(events.back()).contains("error")) << r.body;
  EXPECT_EQ(r.body.find("[DONE]"), std::string::npos) << r.body;
  EXPECT_EQ(migrations(gw.port(), "reset", "failed"), 1);
  EXPECT_TRUE(healthy.requests().empty()) << healthy.requests().dump();
}

// The decode a stream is resumed on dies before the leg's first event (as
// when a second decode is killed while streams move off the first): the
// stream is resumed again, on a decode neither leg used, and ends whole;
// the break is counted once, as resumed.
TEST(Resumption, ALegThatFailsBeforeItsFirstEventIsTriedElsewhere) {
  Sim p("prefill");
  Sim dying("decode", {"--die-after-chunks", "3", "--itl-ms", "2"});
  Sim dead_on_arrival("decode", {"--die-after-chunks", "0"});
  Sim healthy("decode", {"--itl-ms", "2"});
  // The first instance offered: the first leg goes to `dying`, the resumed
  // one to `dead_on_arrival` (the broken decode is not offered), the next
  // to whatever is left.
  EditedFile policy("first_offered.lua", R"(
return { pick = function(ctx, instances) return instances[1] end }
)");
  Gateway gw({"--prefill", p.hostport(), "--decode", dying.hostport(), dead_on_arrival.hostport(),
              healthy.hostport(), "--policy-decode", policy.path(), "--decode-migrations", "2"});
  for (const bool chat : {true, false}) {
    SCOPED_TRACE(chat ? "chat" : "completions");
    const auto r = chat ? post_json(gw.port(), "/v1/chat/completions", chat_body(8, true))
                        : post_json(gw.port(), "/v1/completions", completion_body(8, true));
    const Read got = read_stream(r, chat);
    EXPECT_EQ(got.problems, "") << r.body;
    EXPECT_EQ(got.text, sim_answer(8)) << r.body;
    ASSERT_TRUE(got.usage) << r.body;
    EXPECT_EQ((*got.usage)["completion_tokens"], 8) << r.body;
  }
  EXPECT_EQ(dying.requests().size(), 2u);
  EXPECT_EQ(dead_on_arrival.requests().size(), 2u);
  EXPECT_EQ(healthy.requests().size(), 2u);
  EXPECT_EQ(migrations(gw.port(), "reset", "resumed"), 2);
  EXPECT_EQ(migrations(gw.port(), "reset", "failed"), 0);
}

// A decode that goes silent mid-stream (its socket open) is given up after
// --first-byte-timeout and the stream resumed elsewhere.
TEST(Resumption, StalledDecodeIsResumedAfterTheTimeout) {
  Sim p("prefill");
  Sim stalling("decode", {"--stall-after-chunks", "4", "--itl-ms", "2"});
  Sim healthy("decode", {"--itl-ms", "2"});
  Gateway gw({"--prefill", p.hostport(), "--decode", stalling.hostport(), healthy.hostport(),
              "--first-byte-timeout", "500ms"});
  const auto responses =
      until_one_breaks(gw, stalling, "/v1/chat/completions", chat_body(10, true));
  ASSERT_FALSE(stalling.requests().empty());
  for (const auto& r : responses) {
    const Read got = read_stream(r, true);
    EXPECT_EQ(got.problems, "") << r.body;
    EXPECT_EQ(got.text, sim_answer(10)) << r.body;
  }
  EXPECT_EQ(migrations(gw.port(), "stall", "resumed"), 1);
}

// 200 concurrent streamed chat and completion requests while decodes are
// SIGKILLed and restarted: every client gets a whole, valid answer equal
// to the uninterrupted one, and the migrations are counted.
TEST(Resumption, ConcurrentStreamsSurviveKilledDecodes) {
  Sim p("prefill", {"--max-num-seqs", "512", "--prefill-lanes", "0"});
  std::vector<std::unique_ptr<Sim>> decodes;
  for (int i = 0; i < 3; ++i)
    decodes.push_back(std::make_unique<Sim>(
        "decode", std::vector<std::string>{"--itl-ms", "8", "--max-num-seqs", "512"}));
  Gateway gw({"--prefill", p.hostport(), "--decode", decodes[0]->hostport(), decodes[1]->hostport(),
              decodes[2]->hostport(), "--decode-migrations", "2", "--retry-budget", "1",
              "--eject-after", "1000", "--health-interval", "200ms"});
  constexpr int kClients = 200;
  constexpr int kTokens = 80;
  std::vector<Response> responses(kClients);
  std::atomic<int> started{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      ++started;
      const bool chat = i % 2 == 0;
      responses[i] =
          chat ? post_json(gw.port(), "/v1/chat/completions", chat_body(kTokens, i % 4 == 0))
               : post_json(gw.port(), "/v1/completions", completion_body(kTokens, i % 4 == 1));
    });
  }
  // Two kills at random moments while the streams run (each lasts about
  // 80 x 8 ms), each decode restarted on its port a moment later.
  std::mt19937 rng(std::random_device{}());
  for (int k = 0; k < 2; ++k) {
    const std::size_t victim = k;  // two different decodes
    // Once streams run there (however slow the machine is to start 200
    // clients), at a random moment.
    ASSERT_TRUE(eventually([&] { return decodes[victim]->requests().size() >= 10; },
                           std::chrono::seconds(20)));
    // The second kill comes after the first one's retries have started
    // streaming: a request that has not had its first byte is retried once
    // (a second failure before it is a 502, as configured), so two kills
    // within one request's first-byte wait (the retries of the first, sent
    // to the second victim, under ASan) fail it by design, not by fault.
    if (k == 1)
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 100));
    const std::string port = std::to_string(decodes[victim]->port());
    decodes[victim]->process().signal(SIGKILL);
    decodes[victim]->process().wait();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    decodes[victim] = std::make_unique<Sim>(
        "decode",
        std::vector<std::string>{"--itl-ms", "8", "--max-num-seqs", "512", "--port", port});
  }
  for (auto& t : clients)
    t.join();
  int whole = 0;
  for (int i = 0; i < kClients; ++i) {
    const bool chat = i % 2 == 0;
    const Read got = read_stream(responses[i], chat);
    EXPECT_EQ(got.problems, "") << "client " << i << ": " << responses[i].body;
    EXPECT_EQ(got.text, sim_answer(kTokens)) << "client " << i << ": " << responses[i].body;
    if (got.usage) {
      EXPECT_EQ((*got.usage)["completion_tokens"], kTokens) << responses[i].body;
    }
    whole += got.problems.empty() && got.text == sim_answer(kTokens);
  }
  EXPECT_EQ(whole, kClients);
  EXPECT_GE(migrations(gw.port(), "reset", "resumed"), 2);
  EXPECT_EQ(migrations(gw.port(), "reset", "failed"), 0);
  EXPECT_EQ(migrations(gw.port(), "reset", "refused"), 0);
}

// Drain with a deadline: 50 long streams run on a decode that is drained
// with a 1 s deadline; at the deadline they move to the other decode and
// all complete whole, and nothing runs on the drained one after it.
TEST(Resumption, DrainDeadlineMovesStreamsElsewhere) {
  Sim p("prefill", {"--max-num-seqs", "128", "--prefill-lanes", "0"});
  Sim drained("decode", {"--itl-ms", "10", "--max-num-seqs", "128"});
  Sim other("decode", {"--itl-ms", "10", "--max-num-seqs", "128"});
  AdminGateway g({"--prefill", p.hostport(), "--decode", drained.hostport()});
  constexpr int kStreams = 50;
  constexpr int kTokens = 250;  // 2.5 s each: the deadline falls mid-stream
  std::vector<Response> responses(kStreams);
  std::vector<std::thread> clients;
  for (int i = 0; i < kStreams; ++i) {
    clients.emplace_back([&, i] {
      responses[i] = i % 2 == 0
                         ? post_json(g.port(), "/v1/chat/completions", chat_body(kTokens, true))
                         : post_json(g.port(), "/v1/completions", completion_body(kTokens, false));
    });
  }
  ASSERT_TRUE(eventually([&] { return drained.requests().size() == kStreams; }))
      << drained.requests().size();
  ASSERT_EQ(g.call("POST", "/admin/instances", {{"role", "decode"}, {"url", other.url()}}).status,
            201);
  const auto id = g.instance_by_url(drained.url())["id"].get<int>();
  const auto drained_at = now_ms();
  ASSERT_EQ(g.call("POST", "/admin/instances/" + std::to_string(id) + "/drain?deadline=1s").status,
            200);
  for (auto& t : clients)
    t.join();
  for (int i = 0; i < kStreams; ++i) {
    const Read got = read_stream(responses[i], i % 2 == 0);
    EXPECT_EQ(got.problems, "") << "client " << i << ": " << responses[i].body.substr(0, 400);
    EXPECT_EQ(got.text, sim_answer(kTokens)) << "client " << i;
    if (got.usage) {
      EXPECT_EQ((*got.usage)["completion_tokens"], kTokens);
    }
  }
  // Every leg on the drained decode ended by the deadline (and a moment).
  for (const auto& r : drained.requests()) {
    ASSERT_TRUE(r.contains("ended_at_ms") && r["ended_at_ms"].is_number()) << r.dump();
    EXPECT_LE(r["ended_at_ms"].get<std::int64_t>(), drained_at + 1000 + 500) << r.dump();
  }
  EXPECT_EQ(other.requests().size(), static_cast<std::size_t>(kStreams));
  EXPECT_EQ(migrations(g.port(), "drain", "resumed"), kStreams);
  // Bad deadlines are refused before anything is drained.
  EXPECT_EQ(
      g.call("POST", "/admin/instances/" + std::to_string(id) + "/drain?deadline=soon").status,
      400);
  EXPECT_EQ(
      g.call("POST", "/admin/instances/" + std::to_string(id) + "/drain", {{"deadline_ms", -1}})
          .status,
      400);
}

}  // namespace
}  // namespace pdgate::test
