// Every kind of failure on the request path, one row each: what the client
// gets (status and the OpenAI error body's `type`) and the one
// pdgate_requests_total{route,status,stage} series that counts it. The
// status is decided in one place (core/net/errors.cpp status_of) and the count
// at the request's single exit; this table checks both from outside.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <map>
#include <regex>
#include <thread>

#include "tests/integration/harness.hpp"

namespace pdgate::test {
namespace {

Json chat(bool stream, int max_tokens = 3) {
  return {{"model", "sim-model"},
          {"messages", {{{"role", "user"}, {"content", "hello there"}}}},
          {"max_tokens", max_tokens},
          {"stream", stream}};
}

// A chat with an image: the encoders get one request per item.
std::string image_chat() {
  return R"({"model":"sim-model","max_tokens":2,"messages":[{"role":"user","content":[)"
         R"({"type":"text","text":"what is this"},{"type":"image_url","image_url":)"
         R"({"url":"data:image/png;base64,iVBORw0KGgo="}}]}]})";
}

// A decode engine that answers 200 with a JSON header and a Content-Length,
// then closes the connection half-way through the body.
class CutAfterHeaderEngine {
 public:
  CutAfterHeaderEngine() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(fd_, 16);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      for (;;) {
        const int c = ::accept(fd_, nullptr, nullptr);
        if (c < 0)
          return;
        std::string got;
        char buf[8192];
        // Header, then as much body as arrives at once: enough here.
        while (got.find("\r\n\r\n") == std::string::npos) {
          auto n = ::recv(c, buf, sizeof buf, 0);
          if (n <= 0)
            break;
          got.append(buf, static_cast<std::size_t>(n));
        }
        static const std::string cut =
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n"
            "{\"id\":\"cmpl-1\",\"object\":\"chat.completion\",\"choices\":[";
        (void)::send(c, cut.data(), cut.size(), MSG_NOSIGNAL);
        ::close(c);
        ++served_;
      }
    });
  }
  ~CutAfterHeaderEngine() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  std::string hostport() const { return "127.0.0.1:" + std::to_string(port_); }
  int served() const { return served_.load(); }

 private:
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<int> served_{0};
  std::thread thread_;
};

// pdgate_requests_total's samples, keyed "route status stage".
std::map<std::string, double> request_counts(std::uint16_t port) {
  std::map<std::string, double> out;
  const std::string text = get(port, "/metrics").body;
  static const std::regex line(
      R"re(pdgate_requests_total\{route="([^"]*)",status="([0-9]+)",stage="([a-z]+)"\} ([0-9.e+]+))re");
  for (std::sregex_iterator it(text.begin(), text.end(), line), end; it != end; ++it)
    out[(*it)[1].str() + " " + (*it)[2].str() + " " + (*it)[3].str()] += std::stod((*it)[4]);
  return out;
}

double total(const std::map<std::string, double>& m) {
  double t = 0;
  for (const auto& [k, v] : m)
    t += v;
  return t;
}

double metric_sum(std::uint16_t port, const std::string& name) {
  const std::string text = get(port, "/metrics").body;
  const std::regex line("\n" + name + R"((\{[^}]*\})? ([0-9.e+]+))");
  double sum = 0;
  for (std::sregex_iterator it(text.begin(), text.end(), line), end; it != end; ++it)
    sum += std::stod((*it)[2]);
  return sum;
}

// What a row's scenario leaves running for the check.
struct Scene {
  std::vector<std::unique_ptr<Sim>> sims;
  std::unique_ptr<CutAfterHeaderEngine> cut;
  std::unique_ptr<Gateway> gw;
  // Sends the row's request (after any warm-up) and returns the answer
  // (status 0: the client left before any answer).
  std::function<Response()> send;
  // Checked after the request is counted; default: nothing more.
  std::function<void()> also = [] {};
};

struct Row {
  const char* name;
  std::function<Scene()> setup;
  int status;           // what the client reads; 0: none (it left)
  const char* type;     // error.type of the body; "" when the answer is not an error body
  const char* counted;  // "route status stage" of the series that grows by one
};

// gtest prints the row's name, not its bytes.
void PrintTo(const Row& row, std::ostream* os) {
  *os << row.name;
}

Sim& add_sim(Scene& s, const std::string& role, std::vector<std::string> args = {}) {
  s.sims.push_back(std::make_unique<Sim>(role, std::move(args)));
  return *s.sims.back();
}

// A P/D gateway over the given prefill and decode sim flags.
Scene pd(std::vector<std::string> prefill_args, std::vector<std::string> decode_args,
         std::vector<std::string> gateway_args = {}) {
  Scene s;
  auto& p = add_sim(s, "prefill", std::move(prefill_args));
  auto& d = add_sim(s, "decode", std::move(decode_args));
  std::vector<std::string> args = {"--prefill", p.hostport(), "--decode", d.hostport()};
  args.insert(args.end(), gateway_args.begin(), gateway_args.end());
  s.gw = std::make_unique<Gateway>(args);
  return s;
}

Scene epd(std::vector<std::string> encode_args) {
  Scene s;
  auto& e = add_sim(s, "encode", std::move(encode_args));
  auto& pd = add_sim(s, "both");
  s.gw = std::make_unique<Gateway>(std::vector<std::string>{"--encode-servers-urls", e.url(),
                                                            "--prefill-servers-urls", "disable",
                                                            "--decode-servers-urls", pd.url()});
  const auto port = s.gw->port();
  s.send = [port] {
    return http_request(port, "POST", "/v1/chat/completions", image_chat(),
                        {{"Content-Type", "application/json"}});
  };
  return s;
}

void send_chat(Scene& s, bool stream = false) {
  const auto port = s.gw->port();
  s.send = [port, stream] { return post_json(port, "/v1/chat/completions", chat(stream)); };
}

std::vector<Row> rows() {
  return {
      {"bad_json",
       [] {
         auto s = pd({}, {});
         const auto port = s.gw->port();
         s.send = [port] {
           return http_request(port, "POST", "/v1/chat/completions",
                               "{\"model\": ", {{"Content-Type", "application/json"}});
         };
         return s;
       },
       400, "BadRequestError", "/v1/chat/completions 400 gateway"},
      {"unsupported_media_type",
       [] {
         auto s = pd({}, {});
         const auto port = s.gw->port();
         s.send = [port] {
           return http_request(port, "POST", "/v1/chat/completions", chat(false).dump(),
                               {{"Content-Type", "text/plain"}});
         };
         return s;
       },
       415, "UnsupportedMediaTypeError", "/v1/chat/completions 415 gateway"},
      {"body_too_large",
       [] {
         auto s = pd({}, {}, {"--max-body-size", "1KiB"});
         const auto port = s.gw->port();
         s.send = [port] {
           Json big = chat(false);
           big["messages"][0]["content"] = std::string(4096, 'x');
           return post_json(port, "/v1/chat/completions", big);
         };
         return s;
       },
       413, "RequestTooLargeError", "/v1/chat/completions 413 gateway"},
      {"policy_error_falls_back",
       [] {
         // A policy that raises: the request is routed round-robin and
         // served; the failure is counted as the policy's.
         static const std::string path = [] {
           std::string p = "/tmp/pdgate-failing-policy-" + std::to_string(::getpid()) + ".lua";
           FILE* f = std::fopen(p.c_str(), "w");
           // (The start-up self-check's requests pass: a policy that
           // fails it is refused at start.)
           std::fputs(
               "return { pick = function(ctx, instances)\n"
               "  if ctx.model ~= 'self-check' then error('boom') end\n"
               "  return instances[1]\n"
               "end }\n",
               f);
           std::fclose(f);
           return p;
         }();
         auto s = pd({}, {}, {"--policy", path});
         send_chat(s);
         const auto port = s.gw->port();
         s.also = [port] { EXPECT_GE(metric_sum(port, "pdgate_policy_errors_total"), 1); };
         return s;
       },
       200, "", "/v1/chat/completions 200 decode"},
      {"encoder_4xx",
       [] {
         return epd({"--max-model-len", "2"});
       },
       400, "BadRequestError", "/v1/chat/completions 400 encode"},
      {"encoder_5xx",
       [] {
         return epd({"--error-rate", "1"});
       },
       502, "BadGatewayError", "/v1/chat/completions 502 encode"},
      {"prefill_4xx",
       [] {
         auto s = pd({"--max-model-len", "4"}, {});
         send_chat(s);
         return s;
       },
       400, "BadRequestError", "/v1/chat/completions 400 prefill"},
      {"prefill_5xx",
       [] {
         auto s = pd({"--error-rate", "1"}, {});
         send_chat(s);
         return s;
       },
       502, "BadGatewayError", "/v1/chat/completions 502 prefill"},
      {"prefill_timeout",
       [] {
         auto s = pd({"--hang"}, {}, {"--first-byte-timeout", "300ms"});
         send_chat(s);
         return s;
       },
       502, "BadGatewayError", "/v1/chat/completions 502 prefill"},
      {"prefill_refused",
       [] {
         Scene s;
         auto& d = add_sim(s, "decode");
         s.gw = std::make_unique<Gateway>(std::vector<std::string>{
             "--prefill", "127.0.0.1:" + std::to_string(closed_port()), "--decode", d.hostport()});
         send_chat(s);
         return s;
       },
       502, "BadGatewayError", "/v1/chat/completions 502 prefill"},
      {"decode_before_header",
       [] {
         auto s = pd({}, {"--error-rate", "1"});
         send_chat(s, true);
         return s;
       },
       502, "BadGatewayError", "/v1/chat/completions 502 decode"},
      {"decode_after_header_not_streaming",
       [] {
         // The engine's 200 arrived, its body broke off: the client has
         // received nothing, so it is a 502 and counted as one.
         Scene s;
         auto& p = add_sim(s, "prefill");
         s.cut = std::make_unique<CutAfterHeaderEngine>();
         s.gw = std::make_unique<Gateway>(
             std::vector<std::string>{"--prefill", p.hostport(), "--decode", s.cut->hostport()});
         send_chat(s);
         auto* cut = s.cut.get();
         s.also = [cut] { EXPECT_GE(cut->served(), 1); };
         return s;
       },
       502, "BadGatewayError", "/v1/chat/completions 502 decode"},
      {"decode_mid_stream",
       [] {
         // The client has its 200 and some events: the failure is an
         // in-band error event; the request counts as the 200 it was,
         // and the decode instance's failure is counted.
         auto s = pd({}, {"--die-after-chunks", "2", "--itl-ms", "2"});
         const auto port = s.gw->port();
         s.send = [port] {
           auto r = post_json(port, "/v1/chat/completions", chat(true, 20));
           auto events = sse_data(r.body);
           EXPECT_FALSE(events.empty());
           if (!events.empty()) {
             EXPECT_EQ(Json::parse(events.back())["error"]["type"], "BadGatewayError") << r.body;
           }
           return r;
         };
         s.also = [port] { EXPECT_EQ(metric_sum(port, "pdgate_instance_failures_total"), 1); };
         return s;
       },
       200, "", "/v1/chat/completions 200 decode"},
      {"client_gone_during_prefill",
       [] {
         auto s = pd({"--hang"}, {});
         const auto port = s.gw->port();
         s.send = [port] {
           Connection c(port);
           c.send_request("POST", "/v1/chat/completions", chat(false).dump(),
                          {{"Content-Type", "application/json"}});
           std::this_thread::sleep_for(std::chrono::milliseconds(200));
           c.close();
           return Response{};
         };
         return s;
       },
       0, "", "/v1/chat/completions 499 prefill"},
      {"no_instance",
       [] {
         // The only decode is drained: nothing can serve the stage.
         Scene s;
         auto& p = add_sim(s, "prefill");
         s.gw = std::make_unique<Gateway>(std::vector<std::string>{
             "--prefill", p.hostport(), "--decode", "127.0.0.1:" + std::to_string(closed_port()),
             "--eject-after", "1", "--health-interval", "off"});
         const auto port = s.gw->port();
         // Warm-up: the refused decode is ejected (counted on its own,
         // once its last write completes: waited for, so that it is not
         // taken for the row's request).
         EXPECT_EQ(post_json(port, "/v1/chat/completions", chat(false)).status, 502);
         EXPECT_TRUE(
             eventually([&] { return total(request_counts(port)) >= 1; }, std::chrono::seconds(2)));
         send_chat(s);
         return s;
       },
       503, "ServiceUnavailableError", "/v1/chat/completions 503 decode"},
      {"p2p_nccl_missing_peer",
       [] {
         Scene s;
         auto& p = add_sim(s, "prefill", {"--kv-connector", "p2p-nccl"});
         auto& d = add_sim(s, "decode", {"--kv-connector", "p2p-nccl"});
         s.gw = std::make_unique<Gateway>(
             std::vector<std::string>{"--kv-connector", "p2p-nccl", "--prefill",
                                      p.hostport() + "@127.0.0.1:22001", "--decode", d.hostport()});
         send_chat(s);
         return s;
       },
       503, "ServiceUnavailableError", "/v1/chat/completions 503 decode"},
  };
}

class FailureKinds : public ::testing::TestWithParam<Row> {};

// For each failure kind: the client's status and error type, and exactly
// one pdgate_requests_total series, the row's, grew by one.
TEST_P(FailureKinds, StatusTypeAndCountedSeries) {
  const Row& row = GetParam();
  Scene s = row.setup();
  const auto port = s.gw->port();
  const auto before = request_counts(port);
  const Response r = s.send();
  EXPECT_EQ(r.status, row.status) << r.body;
  if (*row.type != '\0') {
    Json body;
    ASSERT_NO_THROW(body = r.json()) << r.body;
    EXPECT_EQ(body["error"]["type"], row.type) << r.body;
    EXPECT_EQ(body["error"]["code"], row.status) << r.body;
  }
  std::map<std::string, double> after;
  EXPECT_TRUE(eventually(
      [&] {
        after = request_counts(port);
        return total(after) >= total(before) + 1;
      },
      std::chrono::seconds(3)));
  std::map<std::string, double> grown;
  for (const auto& [key, n] : after) {
    const auto it = before.find(key);
    const double was = it == before.end() ? 0 : it->second;
    if (n != was)
      grown[key] = n - was;
  }
  EXPECT_EQ(grown, (std::map<std::string, double>{{row.counted, 1}}));
  s.also();
}

INSTANTIATE_TEST_SUITE_P(EveryKind, FailureKinds, ::testing::ValuesIn(rows()),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace pdgate::test
