#include "plugins/redis_protocol.hpp"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <charconv>

namespace pdgate {

namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

Result<std::string> percent_decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    if (i + 2 >= s.size())
      return fail("bad percent-escape");
    const int hi = hex_value(s[i + 1]), lo = hex_value(s[i + 2]);
    if (hi < 0 || lo < 0)
      return fail("bad percent-escape");
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return out;
}

template <typename Int>
bool parse_int(std::string_view s, Int& out) {
  if (s.empty())
    return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}

// The URL may hold a password: messages never echo it back.
Failure bad_url(std::string_view /*url*/, std::string_view why) {
  return fail("--redis: " + std::string(why));
}

// "[user:]password" -> user, password; "user:" alone is a user without password.
Result<bool> parse_userinfo(std::string_view info, RedisEndpoint& ep) {
  const auto colon = info.find(':');
  auto user =
      percent_decode(colon == std::string_view::npos ? std::string_view{} : info.substr(0, colon));
  auto pass = percent_decode(colon == std::string_view::npos ? info : info.substr(colon + 1));
  if (!user || !pass)
    return fail("bad percent-escape in the user or password");
  ep.username = std::move(*user);
  ep.password = std::move(*pass);
  return true;
}

}  // namespace

std::string RedisEndpoint::display() const {
  std::string s;
  if (is_unix) {
    s = "unix://" + path;
    if (db != 0)
      s += "?db=" + std::to_string(db);
    return s;
  }
  s = "redis://";
  if (!username.empty() || !password.empty())
    s += username + (password.empty() ? "@" : ":***@");
  s += host.find(':') != std::string::npos ? "[" + host + "]" : host;
  s += ":" + std::to_string(port);
  if (db != 0)
    s += "/" + std::to_string(db);
  return s;
}

Result<RedisEndpoint> parse_redis_url(std::string_view url) {
  RedisEndpoint ep;
  if (url.rfind("rediss://", 0) == 0) {
    return bad_url(url, "rediss:// (TLS) is not supported; use redis:// or unix://");
  }
  if (url.rfind("unix://", 0) == 0) {
    ep.is_unix = true;
    std::string_view rest = url.substr(7);
    const auto q = rest.find('?');
    ep.path = std::string(rest.substr(0, q));
    if (ep.path.empty() || ep.path.front() != '/') {
      return bad_url(url, "unix:// needs an absolute socket path (unix:///path/to/redis.sock)");
    }
    if (q != std::string_view::npos) {
      std::string_view query = rest.substr(q + 1);
      while (!query.empty()) {
        const auto amp = query.find('&');
        const std::string_view kv = query.substr(0, amp);
        query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
        const auto eq = kv.find('=');
        if (eq == std::string_view::npos)
          return bad_url(url, "unix:// query items are key=value");
        const std::string_view k = kv.substr(0, eq), v = kv.substr(eq + 1);
        auto decoded = percent_decode(v);
        if (!decoded)
          return bad_url(url, "bad percent-escape in the query");
        if (k == "db") {
          if (!parse_int(v, ep.db) || ep.db < 0)
            return bad_url(url, "db must be a number >= 0");
        } else if (k == "password") {
          ep.password = std::move(*decoded);
        } else if (k == "user") {
          ep.username = std::move(*decoded);
        } else {
          return bad_url(url, "unknown unix:// query item '" + std::string(k) + "'");
        }
      }
    }
    return ep;
  }
  if (url.rfind("redis://", 0) != 0) {
    return bad_url(url, "expected redis://[:password@]host[:port][/db] or unix:///path");
  }
  std::string_view rest = url.substr(8);
  const auto slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  if (slash != std::string_view::npos) {
    std::string_view db = rest.substr(slash + 1);
    if (!db.empty() && (!parse_int(db, ep.db) || ep.db < 0)) {
      return bad_url(url, "the path must be a database number (redis://host:port/0)");
    }
  }
  // The password may contain '@' only percent-escaped, so the last '@'
  // ends the user info.
  if (const auto at = authority.rfind('@'); at != std::string_view::npos) {
    if (auto r = parse_userinfo(authority.substr(0, at), ep); !r)
      return bad_url(url, r.error());
    authority = authority.substr(at + 1);
  }
  std::string_view port_text;
  if (!authority.empty() && authority.front() == '[') {
    const auto close = authority.find(']');
    if (close == std::string_view::npos)
      return bad_url(url, "unclosed '[' in the host");
    ep.host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':')
        return bad_url(url, "junk after ']' in the host");
      port_text = after.substr(1);
    }
  } else {
    const auto colon = authority.rfind(':');
    ep.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos)
      port_text = authority.substr(colon + 1);
  }
  if (ep.host.empty())
    return bad_url(url, "missing host");
  if (!port_text.empty()) {
    if (!parse_int(port_text, ep.port) || ep.port == 0) {
      return bad_url(url, "port must be a number in 1..65535");
    }
  }
  return ep;
}

void bound_reply_reader(redisReader* reader) {
  // hiredis gives every reader the same functions; they are kept once, and
  // the bounded set calls them for what passes.
  static const redisReplyObjectFunctions base = *reader->fn;
  static redisReplyObjectFunctions bounded = [] {
    redisReplyObjectFunctions f = base;
    f.createArray = [](const redisReadTask* task, int elements) -> void* {
      // nullptr: hiredis reports "Out of memory" and the connection ends.
      return elements > kMaxReplyElements ? nullptr : base.createArray(task, elements);
    };
    f.createString = [](const redisReadTask* task, char* str, size_t len) -> void* {
      return len > kMaxReplyBytes ? nullptr : base.createString(task, str, len);
    };
    return f;
  }();
  reader->fn = &bounded;
}

RedisReply copy_reply(const redisReply* r) {
  RedisReply out;
  switch (r->type) {
    case REDIS_REPLY_STRING:
      out.type = RedisReply::Type::string;
      break;
    case REDIS_REPLY_ARRAY:
      out.type = RedisReply::Type::array;
      out.elements.reserve(r->elements);
      for (std::size_t i = 0; i < r->elements; ++i)
        out.elements.push_back(copy_reply(r->element[i]));
      return out;
    case REDIS_REPLY_INTEGER:
      out.type = RedisReply::Type::integer;
      out.integer = r->integer;
      return out;
    case REDIS_REPLY_NIL:
      out.type = RedisReply::Type::nil;
      return out;
    case REDIS_REPLY_STATUS:
      out.type = RedisReply::Type::status;
      break;
    case REDIS_REPLY_ERROR:
      out.type = RedisReply::Type::error;
      break;
    default:
      out.type = RedisReply::Type::none;
      out.text = "unknown reply type";
      return out;
  }
  if (r->str != nullptr)
    out.text.assign(r->str, r->len);
  return out;
}

TakeResult interpret_take_reply(const RedisReply& reply) {
  switch (reply.type) {
    case RedisReply::Type::nil:
      return TakeResult::miss();
    case RedisReply::Type::string:
      return TakeResult::hit(reply.text);
    case RedisReply::Type::none:
      return TakeResult::error(reply.text.empty() ? "no reply" : reply.text);
    case RedisReply::Type::error:
      return TakeResult::error("redis error: " + reply.text);
    default:
      return TakeResult::error("unexpected redis reply type");
  }
}

bool interpret_put_reply(const RedisReply& reply) {
  return reply.type == RedisReply::Type::status && reply.text == "OK";
}

bool is_unknown_command_error(const RedisReply& reply) {
  return reply.type == RedisReply::Type::error && reply.text.rfind("ERR unknown command", 0) == 0;
}

std::string conversation_redis_key(std::string_view prefix, std::string_view conversation_id) {
  std::string key;
  key.reserve(prefix.size() + 5 + conversation_id.size());
  key.append(prefix).append("conv:").append(conversation_id);
  return key;
}

std::chrono::milliseconds Backoff::next() {
  // 2^attempts grows past any sane cap within 32 steps; stop doubling there.
  const unsigned shift = std::min(attempts_, 20u);
  if (attempts_ < 32)
    ++attempts_;
  const auto d = min_ * (1ll << shift);
  return std::min<std::chrono::milliseconds>(d, max_);
}

}  // namespace pdgate
