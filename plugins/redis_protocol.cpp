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

// "host[:port]" or "[v6addr][:port]"; `port` keeps its default when none
// is given.
Result<bool> parse_host_port(std::string_view authority, std::string& host, std::uint16_t& port) {
  std::string_view port_text;
  if (!authority.empty() && authority.front() == '[') {
    const auto close = authority.find(']');
    if (close == std::string_view::npos)
      return fail("unclosed '[' in the host");
    host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':')
        return fail("junk after ']' in the host");
      port_text = after.substr(1);
    }
  } else {
    const auto colon = authority.rfind(':');
    host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos)
      port_text = authority.substr(colon + 1);
  }
  if (host.empty())
    return fail("missing host");
  if (!port_text.empty() && (!parse_int(port_text, port) || port == 0))
    return fail("port must be a number in 1..65535");
  return true;
}

// key=value&key=value, each value percent-decoded, handed to `item`
// (which returns an error message, or an empty string when it took it).
template <typename Item>
Result<bool> parse_query(std::string_view query, Item&& item) {
  while (!query.empty()) {
    const auto amp = query.find('&');
    const std::string_view kv = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    const auto eq = kv.find('=');
    if (eq == std::string_view::npos)
      return fail("query items are key=value");
    auto decoded = percent_decode(kv.substr(eq + 1));
    if (!decoded)
      return fail("bad percent-escape in the query");
    if (std::string why = item(kv.substr(0, eq), kv.substr(eq + 1), std::move(*decoded));
        !why.empty())
      return fail(why);
  }
  return true;
}

// redis+sentinel://[userinfo@]host[:port],host[:port].../master[/db][?query]
Result<RedisEndpoint> parse_sentinel_url(std::string_view url) {
  RedisEndpoint ep;
  std::string_view rest = url.substr(std::string_view("redis+sentinel://").size());
  const auto q = rest.find('?');
  const std::string_view query =
      q == std::string_view::npos ? std::string_view{} : rest.substr(q + 1);
  rest = rest.substr(0, q);
  const auto slash = rest.find('/');
  if (slash == std::string_view::npos || slash + 1 >= rest.size())
    return bad_url(
        url, "redis+sentinel:// needs the master's name: redis+sentinel://host:26379/mymaster");
  std::string_view authority = rest.substr(0, slash);
  std::string_view path = rest.substr(slash + 1);
  const auto db_slash = path.find('/');
  ep.master_name = std::string(path.substr(0, db_slash));
  if (db_slash != std::string_view::npos) {
    std::string_view db = path.substr(db_slash + 1);
    if (!db.empty() && (!parse_int(db, ep.db) || ep.db < 0))
      return bad_url(url, "the database after the master's name must be a number >= 0");
  }
  if (ep.master_name.empty())
    return bad_url(url, "redis+sentinel:// needs the master's name");
  if (const auto at = authority.rfind('@'); at != std::string_view::npos) {
    if (auto r = parse_userinfo(authority.substr(0, at), ep); !r)
      return bad_url(url, r.error());
    authority = authority.substr(at + 1);
  }
  while (true) {
    const auto comma = authority.find(',');
    SentinelAddress s;
    if (auto r = parse_host_port(authority.substr(0, comma), s.host, s.port); !r)
      return bad_url(url, "sentinel " + std::to_string(ep.sentinels.size() + 1) + ": " + r.error());
    ep.sentinels.push_back(std::move(s));
    if (comma == std::string_view::npos)
      break;
    authority = authority.substr(comma + 1);
  }
  if (ep.sentinels.size() > kMaxSentinels)
    return bad_url(url, "at most " + std::to_string(kMaxSentinels) + " sentinels");
  auto r = parse_query(query, [&](std::string_view k, std::string_view, std::string v) {
    if (k == "sentinel_password") {
      ep.sentinel_password = std::move(v);
      return std::string();
    }
    return "unknown redis+sentinel:// query item '" + std::string(k) + "'";
  });
  if (!r)
    return bad_url(url, r.error());
  // Until a sentinel names the master, connections go nowhere.
  ep.host.clear();
  ep.port = 0;
  return ep;
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
  auto host_port = [](const std::string& h, std::uint16_t p) {
    return (h.find(':') != std::string::npos ? "[" + h + "]" : h) + ":" + std::to_string(p);
  };
  s = is_sentinel() ? "redis+sentinel://" : "redis://";
  if (!username.empty() || !password.empty())
    s += username + (password.empty() ? "@" : ":***@");
  if (is_sentinel()) {
    for (std::size_t i = 0; i < sentinels.size(); ++i)
      s += (i ? "," : "") + host_port(sentinels[i].host, sentinels[i].port);
    s += "/" + master_name;
  } else {
    s += host_port(host, port);
  }
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
      auto r = parse_query(rest.substr(q + 1),
                           [&](std::string_view k, std::string_view raw, std::string v) {
                             if (k == "db") {
                               if (!parse_int(raw, ep.db) || ep.db < 0)
                                 return std::string("db must be a number >= 0");
                             } else if (k == "password") {
                               ep.password = std::move(v);
                             } else if (k == "user") {
                               ep.username = std::move(v);
                             } else {
                               return "unknown unix:// query item '" + std::string(k) + "'";
                             }
                             return std::string();
                           });
      if (!r)
        return bad_url(url, r.error());
    }
    return ep;
  }
  if (url.rfind("redis+sentinel://", 0) == 0)
    return parse_sentinel_url(url);
  if (url.rfind("redis://", 0) != 0) {
    return bad_url(url,
                   "expected redis://[:password@]host[:port][/db], "
                   "redis+sentinel://host:port[,host:port]/master or unix:///path");
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
  if (auto r = parse_host_port(authority, ep.host, ep.port); !r)
    return bad_url(url, r.error());
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

std::string resp_command(const std::vector<std::string_view>& args) {
  std::string out = "*" + std::to_string(args.size()) + "\r\n";
  for (auto a : args) {
    out += "$" + std::to_string(a.size()) + "\r\n";
    out.append(a);
    out += "\r\n";
  }
  return out;
}

Result<SentinelAddress> interpret_master_address(const RedisReply& reply) {
  if (reply.type == RedisReply::Type::nil)
    return fail("the sentinel does not know this master");
  if (reply.type == RedisReply::Type::error)
    return fail("sentinel error: " + reply.text);
  if (reply.type != RedisReply::Type::array || reply.elements.size() != 2 ||
      reply.elements[0].type != RedisReply::Type::string ||
      reply.elements[1].type != RedisReply::Type::string)
    return fail("unexpected reply to SENTINEL get-master-addr-by-name");
  SentinelAddress a;
  a.host = reply.elements[0].text;
  if (a.host.empty() || !parse_int(reply.elements[1].text, a.port) || a.port == 0)
    return fail("the sentinel named a master without a usable address");
  return a;
}

bool is_master_role(const RedisReply& reply) {
  return reply.type == RedisReply::Type::array && !reply.elements.empty() &&
         reply.elements[0].text == "master";
}

bool is_readonly_error(const RedisReply& reply) {
  return reply.type == RedisReply::Type::error && reply.text.rfind("READONLY", 0) == 0;
}

std::optional<SentinelAddress> switch_master_target(std::string_view message,
                                                    std::string_view master_name) {
  std::vector<std::string_view> words;
  while (!message.empty() && words.size() < 6) {
    const auto sp = message.find(' ');
    if (sp != 0)
      words.push_back(message.substr(0, sp));
    message = sp == std::string_view::npos ? std::string_view{} : message.substr(sp + 1);
  }
  if (words.size() != 5 || words[0] != master_name)
    return std::nullopt;
  SentinelAddress a;
  a.host = std::string(words[3]);
  if (!parse_int(words[4], a.port) || a.port == 0)
    return std::nullopt;
  return a;
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
