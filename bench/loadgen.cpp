// pdgate-loadgen: an OpenAI-API load generator for measuring the gateway
// against the engine it fronts (see bench/README.md).
//
// It drives /v1/completions or /v1/chat/completions, streaming or not, at a
// fixed concurrency (closed loop) or an open-loop arrival rate, and reports
// throughput and percentiles of time to first token (TTFT), inter-token
// latency (ITL) and end-to-end latency, the way `vllm bench serve` does.
// --turns N runs conversations whose every turn resends the history so far;
// --hold S opens --concurrency streams and keeps them open (idle-stream
// memory measurement). --prefill-url makes the client itself do the P/D
// handshake a gateway would do (prefill, then decode with the prefill's
// kv_transfer_params): the floor for measuring a P/D gateway.
//
// The client must never be what limits the numbers: one thread, Asio
// coroutines, keep-alive connections, a hand-rolled HTTP/1.1 response
// reader (status line, Content-Length or chunked) that timestamps every
// read, and requests built once per worker.
#include <algorithm>
#include <boost/asio.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/net/maybe_tls_stream.hpp"

namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;
constexpr auto use_tuple = net::as_tuple(net::use_awaitable);

namespace {

struct Options {
  std::string host = "127.0.0.1";
  unsigned short port = 0;
  bool tls = false;  // --url is https://
  std::string model = "sim-model";
  bool chat = false;
  bool stream = false;
  unsigned concurrency = 1;
  double rate = 0;  // requests/s; 0 = closed loop at --concurrency
  double duration_s = 10;
  double warmup_s = 1;
  std::size_t max_requests = 0;  // 0 = until --duration
  unsigned max_tokens = 16;
  std::size_t prompt_bytes = 64;
  unsigned turns = 1;
  double hold_s = 0;
  bool json = false;
  std::string label;
  // A request still running after this many seconds is cut off and counted
  // as a timeout (0: never).
  double request_timeout_s = 0;
  // Direct P/D: the prefill engine (--url is then the decode engine).
  std::string prefill_host;
  unsigned short prefill_port = 0;
};

[[noreturn]] void usage(const char* why) {
  if (why)
    std::fprintf(stderr, "pdgate-loadgen: %s\n", why);
  std::fprintf(stderr,
               "usage: pdgate-loadgen --url http[s]://HOST:PORT [options]\n"
               "  --chat                 /v1/chat/completions (default /v1/completions)\n"
               "  --stream               stream: true (SSE); TTFT and ITL are measured\n"
               "  --concurrency N        requests in flight at once, closed loop (1)\n"
               "  --rate R               open loop: R requests/s, Poisson arrivals\n"
               "  --duration S           measured seconds (10)\n"
               "  --warmup S             seconds run but not measured (1)\n"
               "  --requests N           stop after N measured requests\n"
               "  --max-tokens N         max_tokens of every request (16)\n"
               "  --prompt-bytes N       prompt size in bytes (64)\n"
               "  --model NAME           model (sim-model)\n"
               "  --turns N              multi-turn: conversations of N turns resending history\n"
               "  --hold S               open --concurrency streams, hold them S s, exit\n"
               "  --request-timeout S    cut off (and count as a timeout) a request running S s\n"
               "  --prefill-url URL      direct P/D: POST each request first to this prefill\n"
               "                         engine (max_tokens 1, stream false, kv_transfer_params\n"
               "                         do_remote_decode), then to --url (the decode engine)\n"
               "                         with the returned kv_transfer_params; TTFT and e2e\n"
               "                         count from the prefill request's start\n"
               "  --label TEXT           name put in the JSON line\n"
               "  --json                 one JSON line on stdout instead of a report\n");
  std::exit(2);
}

// "http[s]://HOST:PORT[/...]" -> host, port; returns whether it is https.
bool parse_url(const std::string& url, const char* flag, std::string& host, unsigned short& port) {
  const bool tls = url.rfind("https://", 0) == 0;
  const std::string_view prefix = tls ? "https://" : "http://";
  if (url.rfind(prefix, 0) != 0)
    usage((std::string(flag) + " must be http[s]://HOST:PORT").c_str());
  std::string hp = url.substr(prefix.size());
  if (auto slash = hp.find('/'); slash != std::string::npos)
    hp.resize(slash);
  auto colon = hp.rfind(':');
  if (colon == std::string::npos)
    usage((std::string(flag) + " needs a port").c_str());
  host = hp.substr(0, colon);
  port = static_cast<unsigned short>(std::stoul(hp.substr(colon + 1)));
  return tls;
}

Options parse(int argc, char** argv) {
  Options o;
  std::string url;
  std::string prefill_url;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc)
        usage(("missing value for " + a).c_str());
      return argv[++i];
    };
    if (a == "--url")
      url = val();
    else if (a == "--chat")
      o.chat = true;
    else if (a == "--stream")
      o.stream = true;
    else if (a == "--concurrency")
      o.concurrency = std::stoul(val());
    else if (a == "--rate")
      o.rate = std::stod(val());
    else if (a == "--duration")
      o.duration_s = std::stod(val());
    else if (a == "--warmup")
      o.warmup_s = std::stod(val());
    else if (a == "--requests")
      o.max_requests = std::stoull(val());
    else if (a == "--max-tokens")
      o.max_tokens = std::stoul(val());
    else if (a == "--prompt-bytes")
      o.prompt_bytes = std::stoull(val());
    else if (a == "--model")
      o.model = val();
    else if (a == "--turns")
      o.turns = std::max(1ul, std::stoul(val()));
    else if (a == "--hold")
      o.hold_s = std::stod(val());
    else if (a == "--label")
      o.label = val();
    else if (a == "--request-timeout")
      o.request_timeout_s = std::stod(val());
    else if (a == "--prefill-url")
      prefill_url = val();
    else if (a == "--json")
      o.json = true;
    else if (a == "--help" || a == "-h")
      usage(nullptr);
    else
      usage(("unknown flag " + a).c_str());
  }
  o.tls = parse_url(url, "--url", o.host, o.port);
  if (!prefill_url.empty()) {
    parse_url(prefill_url, "--prefill-url", o.prefill_host, o.prefill_port);
    if (o.turns > 1 || o.rate > 0 || o.hold_s > 0)
      usage("--prefill-url works with closed-loop single-turn runs only");
  }
  if (o.concurrency == 0)
    usage("--concurrency must be > 0");
  if (o.turns > 1)
    o.chat = true;
  return o;
}

// A prompt of about n bytes of plain words (no characters that need JSON
// escaping), different per seed so prefix caches do not make every request
// a hit.
std::string make_prompt(std::size_t n, unsigned seed) {
  static const char* words[] = {"the ",  "quick ", "brown ", "fox ",  "jumps ", "over ",
                                "lazy ", "dog ",   "and ",   "runs ", "far ",   "away "};
  std::string s = "request " + std::to_string(seed) + " ";
  std::minstd_rand rng(seed + 1);
  while (s.size() < n)
    s += words[rng() % 12];
  s.resize(std::max<std::size_t>(n, 1));
  return s;
}

struct Sample {
  double e2e_ms = 0;
  double ttft_ms = -1;
  std::vector<double> itl_ms;
  std::size_t tokens = 0;
  // Why it failed: connect, write, read (the connection broke), timeout
  // (--request-timeout), status_NNN, or in_band (a stream that ended with
  // an error event or without [DONE]).
  std::string failure;
};

struct Stats {
  std::vector<double> e2e, ttft, itl;
  std::size_t ok = 0, errors = 0, tokens = 0;
  std::size_t all = 0;  // warm-up included: for per-request CPU accounting
  std::map<std::string, std::size_t> failures;
  double max_e2e_ms = 0;  // of every measured request, failed ones included
  void add(Sample&& s) {
    ++ok;
    tokens += s.tokens;
    e2e.push_back(s.e2e_ms);
    if (s.ttft_ms >= 0)
      ttft.push_back(s.ttft_ms);
    itl.insert(itl.end(), s.itl_ms.begin(), s.itl_ms.end());
  }
};

double pct(std::vector<double>& v, double p) {
  if (v.empty())
    return 0;
  std::sort(v.begin(), v.end());
  double idx = p / 100.0 * (static_cast<double>(v.size()) - 1);
  auto lo = static_cast<std::size_t>(std::floor(idx));
  auto hi = static_cast<std::size_t>(std::ceil(idx));
  return v[lo] + (v[hi] - v[lo]) * (idx - static_cast<double>(lo));
}

double mean(const std::vector<double>& v) {
  if (v.empty())
    return 0;
  double s = 0;
  for (double x : v)
    s += x;
  return s / static_cast<double>(v.size());
}

// Reads one HTTP/1.1 response, decoding chunked framing, and calls
// on_body(bytes, arrival time) for every piece of body as it arrives.
class ResponseReader {
 public:
  explicit ResponseReader(pdgate::MaybeTlsStream& s) : sock_(s) { buf_.reserve(16384); }

  // Returns false on a transport or framing error. `status` is set from
  // the status line; `keep_alive` says whether the connection can be reused.
  template <class OnBody>
  net::awaitable<bool> read(unsigned& status, bool& keep_alive, OnBody&& on_body) {
    // Header.
    std::size_t hdr_end;
    while ((hdr_end = buf_.find("\r\n\r\n")) == std::string::npos) {
      if (!co_await fill())
        co_return false;
    }
    std::string_view head(buf_.data(), hdr_end);
    if (head.size() < 12 || head.substr(0, 5) != "HTTP/")
      co_return false;
    status = static_cast<unsigned>(std::atoi(std::string(head.substr(9, 3)).c_str()));
    keep_alive = true;
    bool chunked = false;
    std::optional<std::size_t> length;
    std::size_t pos = head.find("\r\n");
    while (pos != std::string_view::npos && pos < head.size()) {
      std::size_t next = head.find("\r\n", pos + 2);
      std::string_view line =
          head.substr(pos + 2, (next == std::string_view::npos ? head.size() : next) - pos - 2);
      pos = next;
      auto colon = line.find(':');
      if (colon == std::string_view::npos)
        continue;
      std::string name(line.substr(0, colon));
      for (auto& c : name)
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      std::string_view value = line.substr(colon + 1);
      while (!value.empty() && value.front() == ' ')
        value.remove_prefix(1);
      std::string v(value);
      for (auto& c : v)
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (name == "transfer-encoding" && v.find("chunked") != std::string::npos)
        chunked = true;
      else if (name == "content-length")
        length = std::stoull(v);
      else if (name == "connection" && v.find("close") != std::string::npos)
        keep_alive = false;
    }
    buf_.erase(0, hdr_end + 4);
    if (!chunked) {
      if (!length) {
        keep_alive = false;  // body until close
        for (;;) {
          if (!buf_.empty())
            on_body(std::string_view(buf_), Clock::now());
          buf_.clear();
          if (!co_await fill())
            co_return true;
        }
      }
      std::size_t left = *length;
      for (;;) {
        std::size_t take = std::min(left, buf_.size());
        if (take > 0)
          on_body(std::string_view(buf_.data(), take), Clock::now());
        buf_.erase(0, take);
        left -= take;
        if (left == 0)
          co_return true;
        if (!co_await fill())
          co_return false;
      }
    }
    // Chunked: size line, data, CRLF; a zero size ends the body.
    for (;;) {
      std::size_t eol;
      while ((eol = buf_.find("\r\n")) == std::string::npos) {
        if (!co_await fill())
          co_return false;
      }
      std::size_t size = std::strtoull(buf_.c_str(), nullptr, 16);
      buf_.erase(0, eol + 2);
      if (size == 0) {
        // Trailers (none expected) end with an empty line.
        while ((eol = buf_.find("\r\n")) == std::string::npos) {
          if (!co_await fill())
            co_return false;
        }
        buf_.erase(0, eol + 2);
        co_return true;
      }
      std::size_t left = size;
      for (;;) {
        std::size_t take = std::min(left, buf_.size());
        if (take > 0)
          on_body(std::string_view(buf_.data(), take), Clock::now());
        buf_.erase(0, take);
        left -= take;
        if (left == 0)
          break;
        if (!co_await fill())
          co_return false;
      }
      while (buf_.size() < 2) {
        if (!co_await fill())
          co_return false;
      }
      buf_.erase(0, 2);
    }
  }

  void reset() { buf_.clear(); }

 private:
  net::awaitable<bool> fill() {
    char tmp[16384];
    auto [ec, n] = co_await sock_.async_read_some(net::buffer(tmp), use_tuple);
    if (ec || n == 0)
      co_return false;
    buf_.append(tmp, n);
    co_return true;
  }
  pdgate::MaybeTlsStream& sock_;
  std::string buf_;
};

// Counts SSE events in a streamed body; every data event but [DONE] is a
// token (the sim sends one token per event, as vLLM does).
class SseCounter {
 public:
  bool done_seen = false;   // data: [DONE]
  bool error_seen = false;  // an in-band error event
  // Returns how many token events completed in this piece.
  std::size_t feed(std::string_view piece, std::string* content) {
    pending_.append(piece);
    std::size_t tokens = 0, start = 0, end;
    while ((end = pending_.find("\n\n", start)) != std::string::npos) {
      std::string_view ev(pending_.data() + start, end - start);
      if (ev.rfind("data:", 0) == 0 && ev.find("[DONE]") != std::string_view::npos)
        done_seen = true;
      if (ev.rfind("data:", 0) == 0 && ev.find("\"error\"") != std::string_view::npos &&
          ev.find("\"choices\"") == std::string_view::npos)
        error_seen = true;
      if (ev.rfind("data:", 0) == 0 && ev.find("[DONE]") == std::string_view::npos) {
        ++tokens;
        if (content)
          append_content(ev, *content);
      }
      start = end + 2;
    }
    pending_.erase(0, start);
    return tokens;
  }
  // Appends every "content":"..." or "text":"..." string (still JSON-escaped,
  // so it can be put back into a JSON string verbatim).
  static void append_content(std::string_view json, std::string& out) {
    for (std::string_view key : {"\"content\":\"", "\"text\":\""}) {
      std::size_t p = 0;
      while ((p = json.find(key, p)) != std::string_view::npos) {
        p += key.size();
        std::size_t q = p;
        while (q < json.size() && json[q] != '"')
          q += (json[q] == '\\') ? 2 : 1;
        out.append(json.substr(p, std::min(q, json.size()) - p));
        p = q;
      }
    }
  }

 private:
  std::string pending_;
};

struct Shared {
  Options opt;
  net::io_context& io;
  tcp::endpoint ep;
  tcp::endpoint prefill_ep;  // direct P/D only
  Clock::time_point start, measure_from, stop_at;
  Stats stats;
  std::size_t started = 0;
  bool stopping = false;
  unsigned seq = 0;
  std::size_t held = 0;
  std::size_t hold_failed = 0;
  net::ssl::context* tls = nullptr;  // --url is https://
};

// `extra_headers`: complete header lines, each ending in CRLF.
std::string build_request(const Options& o, const std::string& host, unsigned short port,
                          const std::string& body, std::string_view extra_headers = {}) {
  const char* path = o.chat ? "/v1/chat/completions" : "/v1/completions";
  std::string r;
  r.reserve(body.size() + 256);
  r += "POST ";
  r += path;
  r += " HTTP/1.1\r\nHost: ";
  r += host + ":" + std::to_string(port);
  r += "\r\n";
  r += extra_headers;
  r += "Content-Type: application/json\r\nContent-Length: ";
  r += std::to_string(body.size());
  r += "\r\n\r\n";
  r += body;
  return r;
}

std::string build_request(const Shared& sh, const std::string& body) {
  return build_request(sh.opt, sh.opt.host, sh.opt.port, body);
}

// The request body. `stream` and `max_tokens` default to the options';
// `extra_members` (",\"key\":value...") is added before the closing brace.
std::string build_body(const Options& o, const std::string& prompt_or_messages, bool messages_raw,
                       bool stream, unsigned max_tokens, std::string_view extra_members) {
  std::string b;
  b.reserve(prompt_or_messages.size() + 200);
  b += "{\"model\":\"" + o.model + "\",";
  if (o.chat) {
    if (messages_raw) {
      b += "\"messages\":[" + prompt_or_messages + "],";
    } else {
      b += "\"messages\":[{\"role\":\"user\",\"content\":\"" + prompt_or_messages + "\"}],";
    }
  } else {
    b += "\"prompt\":\"" + prompt_or_messages + "\",";
  }
  b += "\"max_tokens\":" + std::to_string(max_tokens) + ",\"ignore_eos\":true,";
  b += "\"stream\":";
  b += stream ? "true" : "false";
  b += extra_members;
  b += "}";
  return b;
}

std::string build_body(const Options& o, const std::string& prompt_or_messages, bool messages_raw) {
  return build_body(o, prompt_or_messages, messages_raw, o.stream, o.max_tokens, {});
}

// The raw JSON text of the top-level member `key` of the object `json`
// (nullopt when absent or when `json` is not an object this simple scanner
// can walk).
std::optional<std::string_view> top_level_member(std::string_view json, std::string_view key) {
  std::size_t i = 0;
  auto ws = [&] {
    while (i < json.size() &&
           (json[i] == ' ' || json[i] == '\n' || json[i] == '\r' || json[i] == '\t'))
      ++i;
  };
  // Skips a string starting at json[i] == '"'; returns its raw contents.
  auto string = [&]() -> std::optional<std::string_view> {
    const std::size_t start = ++i;
    while (i < json.size() && json[i] != '"')
      i += json[i] == '\\' ? 2 : 1;
    if (i >= json.size())
      return std::nullopt;
    return json.substr(start, i++ - start);
  };
  // Skips one value starting at json[i]; returns false on malformed input.
  auto value = [&]() -> bool {
    int depth = 0;
    while (i < json.size()) {
      const char c = json[i];
      if (c == '"') {
        if (!string())
          return false;
      } else if (c == '{' || c == '[') {
        ++depth;
        ++i;
      } else if (c == '}' || c == ']') {
        if (depth == 0)
          return true;
        --depth;
        ++i;
      } else if (c == ',' && depth == 0) {
        return true;
      } else {
        ++i;
      }
      if (depth == 0 && i < json.size() && (c == '"' || c == '}' || c == ']')) {
        ws();
        return true;
      }
    }
    return depth == 0;
  };
  ws();
  if (i >= json.size() || json[i] != '{')
    return std::nullopt;
  ++i;
  for (;;) {
    ws();
    if (i >= json.size() || json[i] != '"')
      return std::nullopt;
    auto name = string();
    ws();
    if (!name || i >= json.size() || json[i] != ':')
      return std::nullopt;
    ++i;
    ws();
    const std::size_t start = i;
    if (!value())
      return std::nullopt;
    std::string_view v = json.substr(start, i - start);
    while (!v.empty() &&
           (v.back() == ' ' || v.back() == '\n' || v.back() == '\r' || v.back() == '\t'))
      v.remove_suffix(1);
    if (*name == key)
      return v;
    ws();
    if (i >= json.size() || json[i] != ',')
      return std::nullopt;
    ++i;
  }
}

// What a prefill request asks for with nothing cached (as vLLM's proxies
// and plugins/kv_bodies.hpp send it).
constexpr std::string_view kPrefillKvMember =
    R"(,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,)"
    R"("remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null})";

class Connection {
 public:
  explicit Connection(Shared& sh) : sh_(sh), sock_(sh.io.get_executor()), reader_(sock_) {}

  Connection(Shared& sh, tcp::endpoint ep)
      : sh_(sh), ep_(ep), sock_(sh.io.get_executor()), reader_(sock_) {}

  net::awaitable<bool> ensure_open() {
    if (open_)
      co_return true;
    reader_.reset();
    boost::system::error_code ec;
    sock_.close();
    auto [cec] = co_await sock_.tcp().async_connect(ep_ ? *ep_ : sh_.ep, use_tuple);
    if (cec)
      co_return false;
    sock_.socket().set_option(tcp::no_delay(true), ec);
    // https:// (--url only): a fresh TLS session per connection, the
    // certificate not checked (a benchmark, on loopback).
    if (sh_.tls && !ep_) {
      auto [hec] = co_await sock_.start_tls(*sh_.tls).async_handshake(net::ssl::stream_base::client,
                                                                      use_tuple);
      if (hec)
        co_return false;
    }
    open_ = true;
    co_return true;
  }

  // Sends one request and reads its answer; fills `s`. `content` collects
  // the answer's text for multi-turn conversations.
  net::awaitable<bool> exchange(const std::string& request, Sample& s, std::string* content,
                                bool* got_header = nullptr) {
    const auto t0 = Clock::now();
    co_return co_await exchange_at(t0, sh_.opt.stream, request, s, content, nullptr, got_header);
  }

  // The same, with times counted from `t0` (earlier than now in direct P/D,
  // where the prefill exchange came first) and the body's raw bytes
  // appended to `raw_body` when given (non-streaming only).
  net::awaitable<bool> exchange_at(Clock::time_point t0, bool stream, const std::string& request,
                                   Sample& s, std::string* content, std::string* raw_body,
                                   bool* got_header = nullptr) {
    if (!co_await ensure_open()) {
      s.failure = "connect";
      co_return false;
    }
    // --request-timeout: the socket is closed under the exchange, which
    // then fails and is counted as a timeout.
    auto timed_out = std::make_shared<bool>(false);
    std::optional<net::steady_timer> deadline;
    if (sh_.opt.request_timeout_s > 0) {
      deadline.emplace(sh_.io);
      deadline->expires_after(std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(sh_.opt.request_timeout_s)));
      deadline->async_wait([timed_out, sock = &sock_](const boost::system::error_code& ec) {
        if (ec)
          return;  // cancelled: the exchange ended (the socket may be gone)
        *timed_out = true;
        sock->close();
      });
    }
    auto [wec, wn] = co_await net::async_write(sock_, net::buffer(request), use_tuple);
    if (wec) {
      open_ = false;
      s.failure = *timed_out ? "timeout" : "write";
      co_return false;
    }
    unsigned status = 0;
    bool keep = true;
    SseCounter sse;
    std::string body;
    std::optional<Clock::time_point> last_token;
    auto ms = [](Clock::duration d) {
      return std::chrono::duration<double, std::milli>(d).count();
    };
    bool ok =
        co_await reader_.read(status, keep, [&](std::string_view piece, Clock::time_point at) {
          if (got_header)
            *got_header = true;
          if (stream) {
            std::size_t n = sse.feed(piece, content);
            for (std::size_t i = 0; i < n; ++i) {
              if (!last_token)
                s.ttft_ms = ms(at - t0);
              else
                s.itl_ms.push_back(ms(at - *last_token));
              last_token = at;
              ++s.tokens;
            }
          } else {
            if (content)
              body.append(piece);
            if (raw_body)
              raw_body->append(piece);
          }
        });
    s.e2e_ms = ms(Clock::now() - t0);
    if (deadline)
      deadline->cancel();
    if (!ok) {
      open_ = false;
      s.failure = *timed_out ? "timeout" : "read";
      co_return false;
    }
    if (!keep)
      open_ = false;
    if (status != 200) {
      s.failure = "status_" + std::to_string(status);
      co_return false;
    }
    if (stream && (sse.error_seen || !sse.done_seen)) {
      s.failure = "in_band";
      co_return false;
    }
    if (!stream) {
      s.tokens = sh_.opt.max_tokens;
      if (content)
        SseCounter::append_content(body, *content);
    }
    co_return true;
  }

  pdgate::MaybeTlsStream& stream() { return sock_; }

 private:
  Shared& sh_;
  std::optional<tcp::endpoint> ep_;  // else sh_.ep
  pdgate::MaybeTlsStream sock_;
  ResponseReader reader_;
  bool open_ = false;
};

bool measuring(const Shared& sh, Clock::time_point t) {
  return t >= sh.measure_from;
}

bool want_more(Shared& sh) {
  if (sh.stopping)
    return false;
  if (Clock::now() >= sh.stop_at)
    return false;
  if (sh.opt.max_requests && sh.stats.ok + sh.stats.errors >= sh.opt.max_requests)
    return false;
  return true;
}

void record(Shared& sh, Clock::time_point started_at, bool ok, Sample&& s) {
  ++sh.stats.all;
  if (!measuring(sh, started_at))
    return;
  sh.stats.max_e2e_ms = std::max(sh.stats.max_e2e_ms, s.e2e_ms);
  if (ok) {
    sh.stats.add(std::move(s));
  } else {
    ++sh.stats.errors;
    ++sh.stats.failures[s.failure.empty() ? "other" : s.failure];
  }
}

// Direct P/D, what a client without a gateway must do
// (docs/protocol.md): the prefill engine computes one token and
// exports its KV blocks; the decode engine gets the client's request plus
// the prefill's kv_transfer_params and pulls the blocks. Both get the same
// X-Request-Id. Times count from the prefill request.
net::awaitable<bool> pd_exchange(Shared& sh, Connection& prefill, Connection& decode,
                                 const std::string& prompt, const std::string& request_id,
                                 Sample& s) {
  const auto t0 = Clock::now();
  const std::string id_header = "X-Request-Id: " + request_id + "\r\n";
  const std::string prefill_req =
      build_request(sh.opt, sh.opt.prefill_host, sh.opt.prefill_port,
                    build_body(sh.opt, prompt, false, false, 1, kPrefillKvMember), id_header);
  Sample ignored;
  std::string answer;
  if (!co_await prefill.exchange_at(t0, false, prefill_req, ignored, nullptr, &answer))
    co_return false;
  // Passed on untouched; null (or absent) means decode prefills locally.
  std::string kv_member;
  if (auto kv = top_level_member(answer, "kv_transfer_params"); kv && *kv != "null") {
    kv_member = ",\"kv_transfer_params\":";
    kv_member += *kv;
  }
  const std::string decode_req = build_request(
      sh.opt, sh.opt.host, sh.opt.port,
      build_body(sh.opt, prompt, false, sh.opt.stream, sh.opt.max_tokens, kv_member), id_header);
  co_return co_await decode.exchange_at(t0, sh.opt.stream, decode_req, s, nullptr, nullptr);
}

// Closed loop: one connection, one request after another (single turn) or
// one conversation after another (multi-turn).
net::awaitable<void> closed_worker(Shared& sh) {
  Connection conn(sh);
  const unsigned id = sh.seq++;
  unsigned n = 0;
  if (sh.opt.prefill_port != 0) {
    Connection prefill(sh, sh.prefill_ep);
    while (want_more(sh)) {
      const unsigned k = id * 100003u + n++;
      const std::string prompt = make_prompt(sh.opt.prompt_bytes, k);
      const std::string rid = "loadgen-" + std::to_string(id) + "-" + std::to_string(n);
      Sample s;
      auto t = Clock::now();
      bool ok = co_await pd_exchange(sh, prefill, conn, prompt, rid, s);
      record(sh, t, ok, std::move(s));
    }
    co_return;
  }
  while (want_more(sh)) {
    if (sh.opt.turns <= 1) {
      const std::string body =
          build_body(sh.opt, make_prompt(sh.opt.prompt_bytes, id * 100003u + n++), false);
      const std::string req = build_request(sh, body);
      Sample s;
      auto t = Clock::now();
      bool ok = co_await conn.exchange(req, s, nullptr);
      record(sh, t, ok, std::move(s));
      continue;
    }
    // A conversation: each turn sends every earlier message again.
    std::string messages;
    // One id per conversation: lets a gateway that keeps KV between turns
    // find the previous turn's.
    const std::string conv = "conv-" + std::to_string(id) + "-" + std::to_string(n);
    for (unsigned turn = 0; turn < sh.opt.turns && want_more(sh); ++turn) {
      if (!messages.empty())
        messages += ",";
      messages += "{\"role\":\"user\",\"content\":\"" +
                  make_prompt(sh.opt.prompt_bytes, id * 100003u + n++) + "\"}";
      std::string body = build_body(sh.opt, messages, true);
      std::string req = build_request(sh, body);
      req.insert(req.find("\r\n") + 2, "X-Conversation-Id: " + conv + "\r\n");
      Sample s;
      std::string content;
      auto t = Clock::now();
      bool ok = co_await conn.exchange(req, s, &content);
      record(sh, t, ok, std::move(s));
      if (!ok)
        break;
      messages += ",{\"role\":\"assistant\",\"content\":\"" + content + "\"}";
    }
  }
}

// Open loop: a new request every exponential(1/rate) seconds whatever the
// answers do; each goes on an idle connection or a new one.
net::awaitable<void> open_loop(Shared& sh) {
  std::vector<std::unique_ptr<Connection>> idle;
  std::mt19937_64 rng(42);
  std::exponential_distribution<double> gap(sh.opt.rate);
  net::steady_timer timer(sh.io);
  auto next = Clock::now();
  std::size_t inflight = 0;
  unsigned n = 0;
  while (want_more(sh)) {
    next += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap(rng)));
    timer.expires_at(next);
    co_await timer.async_wait(use_tuple);
    std::unique_ptr<Connection> c;
    if (!idle.empty()) {
      c = std::move(idle.back());
      idle.pop_back();
    } else {
      c = std::make_unique<Connection>(sh);
    }
    ++inflight;
    net::co_spawn(
        sh.io,
        [&sh, &idle, &inflight, c = std::move(c), k = n++]() mutable -> net::awaitable<void> {
          const std::string req =
              build_request(sh, build_body(sh.opt, make_prompt(sh.opt.prompt_bytes, k), false));
          Sample s;
          auto t = Clock::now();
          bool ok = co_await c->exchange(req, s, nullptr);
          record(sh, t, ok, std::move(s));
          idle.push_back(std::move(c));
          --inflight;
        },
        net::detached);
  }
  // Let the last requests finish (bounded) before the process reports.
  auto deadline = Clock::now() + std::chrono::seconds(30);
  while (inflight > 0 && Clock::now() < deadline) {
    timer.expires_after(std::chrono::milliseconds(10));
    co_await timer.async_wait(use_tuple);
  }
  sh.stopping = true;
  sh.io.stop();
}

// Idle streams: open every connection, send a streaming request on each,
// wait until each has its response header, then hold them.
net::awaitable<void> hold_one(Shared& sh, unsigned k,
                              std::shared_ptr<std::vector<std::unique_ptr<Connection>>> keep) {
  auto c = std::make_unique<Connection>(sh);
  Connection* cp = c.get();
  keep->push_back(std::move(c));
  const std::string req =
      build_request(sh, build_body(sh.opt, make_prompt(sh.opt.prompt_bytes, k), false));
  if (!co_await cp->ensure_open()) {
    ++sh.hold_failed;
    co_return;
  }
  auto [wec, wn] = co_await net::async_write(cp->stream(), net::buffer(req), use_tuple);
  if (wec) {
    ++sh.hold_failed;
    co_return;
  }
  // The response header ends with an empty line; the stream stays open.
  std::string got;
  char tmp[4096];
  while (got.find("\r\n\r\n") == std::string::npos) {
    auto [ec, n] = co_await cp->stream().async_read_some(net::buffer(tmp), use_tuple);
    if (ec) {
      ++sh.hold_failed;
      co_return;
    }
    got.append(tmp, n);
  }
  if (got.rfind("HTTP/1.1 200", 0) != 0) {
    ++sh.hold_failed;
    co_return;
  }
  ++sh.held;
  // Keep reading (and dropping) whatever comes, as a real client would.
  for (;;) {
    auto [ec, n] = co_await cp->stream().async_read_some(net::buffer(tmp), use_tuple);
    if (ec)
      co_return;
  }
}

net::awaitable<void> hold_all(Shared& sh) {
  auto keep = std::make_shared<std::vector<std::unique_ptr<Connection>>>();
  keep->reserve(sh.opt.concurrency);
  net::steady_timer timer(sh.io);
  const auto t0 = Clock::now();
  for (unsigned k = 0; k < sh.opt.concurrency; ++k) {
    net::co_spawn(sh.io, hold_one(sh, k, keep), net::detached);
    // Pace the connects so the listen backlog is never overrun.
    if (k % 200 == 199) {
      timer.expires_after(std::chrono::milliseconds(5));
      co_await timer.async_wait(use_tuple);
    }
  }
  while (sh.held + sh.hold_failed < sh.opt.concurrency &&
         Clock::now() - t0 < std::chrono::seconds(60)) {
    timer.expires_after(std::chrono::milliseconds(20));
    co_await timer.async_wait(use_tuple);
  }
  const double setup = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("HOLDING %zu streams (%zu failed) after %.2f s\n", sh.held, sh.hold_failed, setup);
  std::fflush(stdout);
  timer.expires_after(
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(sh.opt.hold_s)));
  co_await timer.async_wait(use_tuple);
  std::printf("RELEASED\n");
  std::fflush(stdout);
  sh.io.stop();
}

std::string failures_json(const Stats& st) {
  std::string out = "{";
  for (const auto& [kind, n] : st.failures) {
    if (out.size() > 1)
      out += ",";
    out += "\"" + kind + "\":" + std::to_string(n);
  }
  return out + "}";
}

void report(Shared& sh, double measured_s) {
  auto& st = sh.stats;
  const double rps = static_cast<double>(st.ok) / measured_s;
  const double tps = static_cast<double>(st.tokens) / measured_s;
  if (sh.opt.json) {
    std::printf(
        "{\"label\":\"%s\",\"ok\":%zu,\"all\":%zu,\"errors\":%zu,\"seconds\":%.3f,\"rps\":%.2f,"
        "\"tok_s\":%.1f,"
        "\"e2e_p50\":%.4f,\"e2e_p90\":%.4f,\"e2e_p99\":%.4f,\"e2e_mean\":%.4f,"
        "\"ttft_p50\":%.4f,\"ttft_p90\":%.4f,\"ttft_p99\":%.4f,\"ttft_mean\":%.4f,"
        "\"itl_p50\":%.4f,\"itl_p90\":%.4f,\"itl_p99\":%.4f,\"itl_mean\":%.4f,"
        "\"max_e2e_ms\":%.1f,\"failures\":%s}\n",
        sh.opt.label.c_str(), st.ok, st.all, st.errors, measured_s, rps, tps, pct(st.e2e, 50),
        pct(st.e2e, 90), pct(st.e2e, 99), mean(st.e2e), pct(st.ttft, 50), pct(st.ttft, 90),
        pct(st.ttft, 99), mean(st.ttft), pct(st.itl, 50), pct(st.itl, 90), pct(st.itl, 99),
        mean(st.itl), st.max_e2e_ms, failures_json(st).c_str());
    return;
  }
  std::printf("============ pdgate-loadgen result ============\n");
  std::printf("%-32s %zu\n", "Successful requests:", st.ok);
  std::printf("%-32s %zu %s\n", "Failed requests:", st.errors, failures_json(st).c_str());
  std::printf("%-32s %.1f\n", "Longest request (ms):", st.max_e2e_ms);
  std::printf("%-32s %.2f\n", "Measured duration (s):", measured_s);
  std::printf("%-32s %.2f\n", "Request throughput (req/s):", rps);
  std::printf("%-32s %.1f\n", "Output token throughput (tok/s):", tps);
  auto block = [](const char* name, std::vector<double>& v) {
    std::printf("---------- %s ----------\n", name);
    std::printf("%-32s %.3f\n", "Mean (ms):", mean(v));
    std::printf("%-32s %.3f\n", "P50 (ms):", pct(v, 50));
    std::printf("%-32s %.3f\n", "P90 (ms):", pct(v, 90));
    std::printf("%-32s %.3f\n", "P99 (ms):", pct(v, 99));
  };
  if (sh.opt.stream) {
    block("Time to first token", st.ttft);
    block("Inter-token latency", st.itl);
  }
  block("End-to-end latency", st.e2e);
}

}  // namespace

int main(int argc, char** argv) {
  Options opt = parse(argc, argv);
  net::io_context io(1);
  net::ssl::context tls(net::ssl::context::tls_client);
  tls.set_verify_mode(net::ssl::verify_none);
  Shared sh{opt, io, {}, {}, {}, {}, {}, {}, 0, false, 0, 0, 0, opt.tls ? &tls : nullptr};
  auto resolve = [&io](const std::string& host, unsigned short port) {
    boost::system::error_code ec;
    auto addr = net::ip::make_address(host, ec);
    if (!ec)
      return tcp::endpoint(addr, port);
    tcp::resolver res(io);
    auto r = res.resolve(host, std::to_string(port), ec);
    if (ec || r.empty())
      usage("cannot resolve host");
    return r.begin()->endpoint();
  };
  sh.ep = resolve(opt.host, opt.port);
  if (opt.prefill_port != 0)
    sh.prefill_ep = resolve(opt.prefill_host, opt.prefill_port);
  sh.start = Clock::now();
  auto secs = [](double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  };
  if (opt.hold_s > 0) {
    opt.stream = sh.opt.stream = true;
    net::co_spawn(io, hold_all(sh), net::detached);
    io.run();
    return sh.hold_failed == 0 ? 0 : 1;
  }
  sh.measure_from = sh.start + secs(opt.warmup_s);
  sh.stop_at = sh.measure_from + secs(opt.duration_s);
  if (opt.rate > 0) {
    net::co_spawn(io, open_loop(sh), net::detached);
  } else {
    for (unsigned i = 0; i < opt.concurrency; ++i)
      net::co_spawn(io, closed_worker(sh), net::detached);
  }
  io.run();
  const auto end = std::min(Clock::now(), sh.stop_at);
  double measured = std::chrono::duration<double>(end - sh.measure_from).count();
  if (measured <= 0)
    measured = 1e-9;
  report(sh, measured);
  return sh.stats.ok > 0 ? 0 : 1;
}
