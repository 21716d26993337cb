#include "plugins/redis_protocol.hpp"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <charconv>

#include "core/base/url.hpp"

namespace pdgate {

namespace {

template <typename Int>
bool parse_int(std::string_view s, Int& out) {
  if (s.empty())
    return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}

// The URL may hold a password: messages never echo it back.
Failure bad_url(std::string_view why) {
  return fail("--redis: " + std::string(why));
}

// "[user:]password@": a user info without ':' is a password, as redis-cli
// -u reads it; "user:" alone is a user without password.
void take_userinfo(const Url& u, RedisEndpoint& ep) {
  if (!u.has_userinfo)
    return;
  if (u.password) {
    ep.username = u.user;
    ep.password = *u.password;
  } else {
    ep.password = u.user;
  }
}

// "N" or "" (database 0): a redis:// path, or what follows a sentinel master.
bool take_db(std::string_view text, RedisEndpoint& ep) {
  return text.empty() || (parse_int(text, ep.db) && ep.db >= 0);
}

// A URL's path without its leading '/'.
std::string_view path_after_slash(const Url& u) {
  return std::string_view(u.path).substr(u.path.empty() ? 0 : 1);
}

Result<RedisEndpoint> parse_unix_url(const Url& u) {
  RedisEndpoint ep;
  ep.is_unix = true;
  auto path = percent_decoded(u.path);
  if (!path || !u.hosts.front().host.empty() || u.hosts.front().port || u.hosts.size() > 1 ||
      u.has_userinfo || !path->starts_with('/')) {
    return bad_url("unix:// needs an absolute socket path (unix:///path/to/redis.sock)");
  }
  ep.path = std::move(*path);
  auto items = query_items(u.query.value_or(""));
  if (!items)
    return bad_url(items.error());
  for (auto& [k, v] : *items) {
    if (k == "db") {
      if (!parse_int(v, ep.db) || ep.db < 0)
        return bad_url("db must be a number >= 0");
    } else if (k == "password") {
      ep.password = std::move(v);
    } else if (k == "user") {
      ep.username = std::move(v);
    } else {
      return bad_url("unknown unix:// query item '" + k + "'");
    }
  }
  return ep;
}

// redis+sentinel://[userinfo@]host[:port],host[:port].../master[/db][?query]
Result<RedisEndpoint> parse_sentinel_url(const Url& u) {
  RedisEndpoint ep;
  take_userinfo(u, ep);
  const std::string_view path = path_after_slash(u);
  const auto db_slash = path.find('/');
  ep.master_name = std::string(path.substr(0, db_slash));
  if (ep.master_name.empty()) {
    return bad_url(
        "redis+sentinel:// needs the master's name: redis+sentinel://host:26379/mymaster");
  }
  if (db_slash != std::string_view::npos && !take_db(path.substr(db_slash + 1), ep))
    return bad_url("the database after the master's name must be a number >= 0");
  if (u.hosts.size() > kMaxSentinels)
    return bad_url("at most " + std::to_string(kMaxSentinels) + " sentinels");
  for (const UrlHost& h : u.hosts) {
    if (h.host.empty())
      return bad_url("sentinel " + std::to_string(ep.sentinels.size() + 1) + ": missing host");
    ep.sentinels.push_back(SentinelAddress{h.host, h.port.value_or(26379)});
  }
  auto items = query_items(u.query.value_or(""));
  if (!items)
    return bad_url(items.error());
  for (auto& [k, v] : *items) {
    if (k != "sentinel_password")
      return bad_url("unknown redis+sentinel:// query item '" + k + "'");
    ep.sentinel_password = std::move(v);
  }
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
  s = is_sentinel() ? (tls ? "rediss+sentinel://" : "redis+sentinel://")
                    : (tls ? "rediss://" : "redis://");
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
  auto u = parse_url(url, HostList::many);
  if (!u)
    return bad_url(u.error());
  if (u->fragment)
    return bad_url("a Redis URL has no #fragment");
  if (u->scheme == "unix")
    return parse_unix_url(*u);
  // rediss: TLS to the server and, with Sentinel, to the sentinels too.
  const bool tls = u->scheme == "rediss" || u->scheme == "rediss+sentinel";
  if (u->scheme == "redis+sentinel" || u->scheme == "rediss+sentinel") {
    auto ep = parse_sentinel_url(*u);
    if (ep)
      ep->tls = tls;
    return ep;
  }
  if (u->scheme != "redis" && u->scheme != "rediss") {
    return bad_url(
        "expected redis[s]://[:password@]host[:port][/db], "
        "redis[s]+sentinel://host:port[,host:port]/master or unix:///path");
  }
  RedisEndpoint ep;
  ep.tls = tls;
  take_userinfo(*u, ep);
  if (u->hosts.size() > 1)
    return bad_url("only redis+sentinel:// lists several hosts");
  if (u->query)
    return bad_url("redis:// takes no query; give the database as the path (redis://host:port/0)");
  const UrlHost& h = u->hosts.front();
  if (h.host.empty())
    return bad_url("missing host");
  ep.host = h.host;
  ep.port = h.port.value_or(6379);
  if (!take_db(path_after_slash(*u), ep))
    return bad_url("the path must be a database number (redis://host:port/0)");
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

ReaderStatus next_reply(redisReader* reader, RedisReply& out) {
  void* reply = nullptr;
  if (redisReaderGetReply(reader, &reply) != REDIS_OK) {
    out = no_reply(std::string("protocol error: ") + reader->errstr);
    return ReaderStatus::error;
  }
  if (reply == nullptr)
    return ReaderStatus::need_more;
  out = copy_reply(static_cast<redisReply*>(reply));
  freeReplyObject(reply);
  return ReaderStatus::reply;
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

std::optional<std::vector<RateLimitAnswer>> interpret_rate_limit_reply(
    const RedisReply& reply, const std::vector<RateLimitDecl>& limits) {
  const auto& e = reply.elements;
  if (reply.type != RedisReply::Type::array || e.size() != 1 + 2 * limits.size())
    return std::nullopt;
  for (const RedisReply& x : e) {
    if (x.type != RedisReply::Type::integer)
      return std::nullopt;
  }
  if (e[0].integer != 0 && e[0].integer != 1)
    return std::nullopt;
  std::vector<RateLimitAnswer> out(limits.size());
  bool all = true;
  for (std::size_t i = 0; i < limits.size(); ++i) {
    const long long count = e[1 + 2 * i].integer, wait = e[2 + 2 * i].integer;
    const RateLimitDecl& l = limits[i];
    // A refused limit is full; one that fits had room (and, counted, one
    // more); more than the limit may stand in a window when the limit was
    // lowered, never more than the largest limit allowed.
    if (count < 0 || count > kMaxRateLimitEvents + 1 || wait < 0 || wait > l.window_ms)
      return std::nullopt;
    const bool fits = wait == 0;
    if (fits ? count > l.limit : count < l.limit)
      return std::nullopt;
    out[i] = {fits, count, wait};
    all = all && fits;
  }
  if (all != (e[0].integer == 1))
    return std::nullopt;
  return out;
}

bool is_unknown_command_error(const RedisReply& reply) {
  return reply.type == RedisReply::Type::error && reply.text.rfind("ERR unknown command", 0) == 0;
}

namespace {

void append_length(std::string& out, char kind, std::size_t n) {
  char digits[24];
  digits[0] = kind;
  auto [end, ec] = std::to_chars(digits + 1, digits + sizeof digits - 2, n);
  (void)ec;  // 20 digits always fit
  *end++ = '\r';
  *end++ = '\n';
  out.append(digits, static_cast<std::size_t>(end - digits));
}

}  // namespace

void append_resp_command(std::string& out, const std::vector<std::string_view>& args) {
  std::size_t size = 16;
  for (auto a : args)
    size += a.size() + 16;
  out.reserve(out.size() + size);
  append_length(out, '*', args.size());
  for (auto a : args) {
    append_length(out, '$', a.size());
    out.append(a);
    out.append("\r\n", 2);
  }
}

std::string resp_command(const std::vector<std::string_view>& args) {
  std::string out;
  append_resp_command(out, args);
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
