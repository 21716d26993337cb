// Parsed Redis replies built by hand, for tests of code that reads them
// (the wire formats, the protocol helpers) without a server.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "plugins/redis_protocol.hpp"

namespace pdgate::test {

inline RedisReply reply(RedisReply::Type t, std::string text = {}) {
  RedisReply r;
  r.type = t;
  r.text = std::move(text);
  return r;
}

inline RedisReply string_reply(std::string text) {
  return reply(RedisReply::Type::string, std::move(text));
}

inline RedisReply array_of(std::vector<RedisReply> items) {
  RedisReply r;
  r.type = RedisReply::Type::array;
  r.elements = std::move(items);
  return r;
}

}  // namespace pdgate::test
