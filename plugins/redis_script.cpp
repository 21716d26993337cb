#include "plugins/redis_script.hpp"

#include <openssl/sha.h>

#include <cstdio>

namespace pdgate {

namespace {

std::string sha1_hex(std::string_view text) {
  unsigned char d[SHA_DIGEST_LENGTH];
  SHA1(reinterpret_cast<const unsigned char*>(text.data()), text.size(), d);
  std::string out;
  char buf[3];
  for (unsigned char c : d) {
    std::snprintf(buf, sizeof buf, "%02x", c);
    out += buf;
  }
  return out;
}

bool is_noscript(const RedisReply& r) {
  return r.type == RedisReply::Type::error && r.text.rfind("NOSCRIPT", 0) == 0;
}

}  // namespace

RedisScript::RedisScript(const char* t) : text(t), sha(sha1_hex(t)) {}

boost::asio::awaitable<RedisReply> run_script(RedisConnection& conn, const RedisScript& s,
                                              const std::vector<std::string>& keys,
                                              const std::vector<std::string>& args) {
  const std::string nkeys = std::to_string(keys.size());
  std::vector<std::string_view> argv{std::string_view("EVALSHA"), s.sha, nkeys};
  for (const auto& k : keys)
    argv.push_back(k);
  for (const auto& a : args)
    argv.push_back(a);
  RedisReply r = co_await conn.command(argv);
  if (is_noscript(r)) {
    argv[0] = "EVAL";
    argv[1] = s.text;
    r = co_await conn.command(argv);
  }
  co_return r;
}

Result<RedisConnectionSettings> script_connection_settings(const std::string& url,
                                                           const RedisClientContext& context,
                                                           std::chrono::milliseconds timeout) {
  auto endpoint = parse_redis_url(url);
  if (!endpoint)
    return fail(endpoint.error());
  RedisConnectionSettings settings;
  settings.endpoint = std::move(*endpoint);
  settings.context = context;
  settings.command_timeout = timeout;
  return settings;
}

}  // namespace pdgate
