// The sans-I/O half of the Redis store: URL parsing, reply meanings,
// reconnect backoff and the warning limiter, without a socket.
#include <gtest/gtest.h>

#include <hiredis/hiredis.h>

#include <string>
#include <utility>
#include <vector>

#include "plugins/redis_protocol.hpp"
#include "tests/plugins/redis_replies.hpp"

namespace pdgate {
namespace {

using namespace std::chrono_literals;

// A bare host gets the default port and database 0, no AUTH.
TEST(RedisUrl, HostOnlyDefaults) {
  auto ep = parse_redis_url("redis://cache.internal");
  ASSERT_TRUE(ep) << ep.error();
  EXPECT_FALSE(ep->is_unix);
  EXPECT_EQ(ep->host, "cache.internal");
  EXPECT_EQ(ep->port, 6379);
  EXPECT_EQ(ep->db, 0);
  EXPECT_TRUE(ep->password.empty());
}

// Password, port and database are all read; the display hides the password.
TEST(RedisUrl, PasswordPortAndDb) {
  auto ep = parse_redis_url("redis://:s3cr%40t@10.0.0.7:6380/3");
  ASSERT_TRUE(ep) << ep.error();
  EXPECT_EQ(ep->host, "10.0.0.7");
  EXPECT_EQ(ep->port, 6380);
  EXPECT_EQ(ep->db, 3);
  EXPECT_EQ(ep->password, "s3cr@t");
  EXPECT_TRUE(ep->username.empty());
  EXPECT_EQ(ep->display().find("s3cr"), std::string::npos);
  EXPECT_EQ(ep->display(), "redis://:***@10.0.0.7:6380/3");
}

// A Redis 6 ACL user comes before the colon.
TEST(RedisUrl, AclUser) {
  auto ep = parse_redis_url("redis://gateway:pw@h:1");
  ASSERT_TRUE(ep) << ep.error();
  EXPECT_EQ(ep->username, "gateway");
  EXPECT_EQ(ep->password, "pw");
}

// A bracketed IPv6 host is unbracketed, its port kept.
TEST(RedisUrl, Ipv6Host) {
  auto ep = parse_redis_url("redis://[::1]:7000");
  ASSERT_TRUE(ep) << ep.error();
  EXPECT_EQ(ep->host, "::1");
  EXPECT_EQ(ep->port, 7000);
  EXPECT_EQ(ep->display(), "redis://[::1]:7000");
}

// A trailing slash without a number means database 0.
TEST(RedisUrl, TrailingSlash) {
  auto ep = parse_redis_url("redis://h:6379/");
  ASSERT_TRUE(ep) << ep.error();
  EXPECT_EQ(ep->db, 0);
}

// unix:// takes an absolute path and optional db/password query items.
TEST(RedisUrl, UnixSocket) {
  auto ep = parse_redis_url("unix:///run/redis/redis.sock?db=2&password=p%20w");
  ASSERT_TRUE(ep) << ep.error();
  EXPECT_TRUE(ep->is_unix);
  EXPECT_EQ(ep->path, "/run/redis/redis.sock");
  EXPECT_EQ(ep->db, 2);
  EXPECT_EQ(ep->password, "p w");
  EXPECT_EQ(ep->display(), "unix:///run/redis/redis.sock?db=2");
}

// Malformed URLs are refused with a message that never repeats the password.
TEST(RedisUrl, Rejects) {
  for (const char* bad :
       {"http://h:1", "redis://", "redis://h:0", "redis://h:70000", "redis://h:x", "redis://h/x",
        "redis://h/-1", "redis://[::1", "unix://relative.sock", "unix:///s?db=x",
        "unix:///s?color=red", "rediss://", "redis://:%zz@h", "redis://:secretpw@:1"}) {
    auto ep = parse_redis_url(bad);
    EXPECT_FALSE(ep) << bad;
    if (!ep) {
      EXPECT_EQ(ep.error().find("secretpw"), std::string::npos) << ep.error();
    }
  }
}

// rediss:// and rediss+sentinel:// are the same URLs over TLS.
TEST(RedisUrl, Tls) {
  auto ep = parse_redis_url("rediss://:pw@redis.example:6380/2");
  ASSERT_TRUE(ep) << ep.error();
  EXPECT_TRUE(ep->tls);
  EXPECT_EQ(ep->host, "redis.example");
  EXPECT_EQ(ep->port, 6380);
  EXPECT_EQ(ep->db, 2);
  EXPECT_EQ(ep->display(), "rediss://:***@redis.example:6380/2");
  ep = parse_redis_url("rediss+sentinel://s1:26380,s2/mymaster");
  ASSERT_TRUE(ep) << ep.error();
  EXPECT_TRUE(ep->tls);
  EXPECT_EQ(ep->sentinels.size(), 2u);
  EXPECT_EQ(ep->display(), "rediss+sentinel://s1:26380,s2:26379/mymaster");
  EXPECT_FALSE(parse_redis_url("redis://h")->tls);
  // The pipeline's bytes are the one-command form's, back to back.
  std::string out = "x";
  append_resp_command(out, {"SET", "k", ""});
  EXPECT_EQ(out, "x*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n");
}

// Percent-escapes in the user and the password are decoded: an '@', ':'
// or '/' in a password is written %40, %3A, %2F.
TEST(RedisUrl, PercentEncodedUserInfo) {
  auto ep = parse_redis_url("redis://:p%40ss@host");
  ASSERT_TRUE(ep) << ep.error();
  EXPECT_EQ(ep->password, "p@ss");
  EXPECT_EQ(ep->host, "host");
  EXPECT_EQ(ep->port, 6379);
  ep = parse_redis_url("redis://app%2Dgw:a%3Ab%2Fc@h:1");
  ASSERT_TRUE(ep) << ep.error();
  EXPECT_EQ(ep->username, "app-gw");
  EXPECT_EQ(ep->password, "a:b/c");
  // A lone user info is the password, as redis-cli -u reads it.
  ep = parse_redis_url("redis://s%40cret@h");
  ASSERT_TRUE(ep) << ep.error();
  EXPECT_TRUE(ep->username.empty());
  EXPECT_EQ(ep->password, "s@cret");
}

// Garbage is refused with --redis and the part at fault in the message,
// and the password never in it.
TEST(RedisUrl, GarbageNamesTheOptionAndThePart) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"redis://my host:6379", "a space in the host"},
      {"redis://h:65536", "invalid port '65536'"},
      {"redis://:secretpw@h:99999", "invalid port"},
      {"redis://:secretpw@", "missing host"},
      {"redis://:secret@pw@h", "%40"},
      {"redis://:secretpw@h?db=1", "takes no query"},
      {"redis://h1:1,h2:2", "only redis+sentinel://"},
      {"redis+sentinel://s1,s 2/m", "host 2: a space in the host"},
      {"unix:///run/redis.sock?password=secretpw&db=x", "db must be"},
  };
  for (const auto& [url, fragment] : bad) {
    auto ep = parse_redis_url(url);
    ASSERT_FALSE(ep) << url;
    EXPECT_EQ(ep.error().rfind("--redis: ", 0), 0u) << ep.error();
    EXPECT_NE(ep.error().find(fragment), std::string::npos) << url << ": " << ep.error();
    EXPECT_EQ(ep.error().find("secret"), std::string::npos) << ep.error();
  }
}

// IPv6 hosts work in each form, a sentinel list included; a '+' in a
// query password stays a '+'.
TEST(RedisUrl, Ipv6SentinelsAndPlusInQueryPassword) {
  auto ep = parse_redis_url("redis+sentinel://[fd00::1]:26380,[fd00::2]/m?sentinel_password=a+b");
  ASSERT_TRUE(ep) << ep.error();
  ASSERT_EQ(ep->sentinels.size(), 2u);
  EXPECT_EQ(ep->sentinels[0].host, "fd00::1");
  EXPECT_EQ(ep->sentinels[0].port, 26380);
  EXPECT_EQ(ep->sentinels[1].host, "fd00::2");
  EXPECT_EQ(ep->sentinels[1].port, 26379);
  EXPECT_EQ(ep->sentinel_password, "a+b");
  EXPECT_EQ(ep->display(), "redis+sentinel://[fd00::1]:26380,[fd00::2]:26379/m");
}

// redis+sentinel:// lists sentinels (26379 by default) and names the master;
// the password is the master's and never shown.
TEST(RedisUrl, Sentinel) {
  auto ep = parse_redis_url(
      "redis+sentinel://:secretpw@s1:26380,[::1],s3/mymaster/2?sentinel_password=sp%21");
  ASSERT_TRUE(ep) << ep.error();
  EXPECT_TRUE(ep->is_sentinel());
  ASSERT_EQ(ep->sentinels.size(), 3u);
  EXPECT_EQ(ep->sentinels[0].host, "s1");
  EXPECT_EQ(ep->sentinels[0].port, 26380);
  EXPECT_EQ(ep->sentinels[1].host, "::1");
  EXPECT_EQ(ep->sentinels[1].port, 26379);
  EXPECT_EQ(ep->sentinels[2].port, 26379);
  EXPECT_EQ(ep->master_name, "mymaster");
  EXPECT_EQ(ep->db, 2);
  EXPECT_EQ(ep->password, "secretpw");
  EXPECT_EQ(ep->sentinel_password, "sp!");
  EXPECT_EQ(ep->display(), "redis+sentinel://:***@s1:26380,[::1]:26379,s3:26379/mymaster/2");
}

// A sentinel URL without a master name, with a bad sentinel address or an
// unknown query item is refused, the password never echoed.
TEST(RedisUrl, SentinelRejects) {
  for (const char* bad :
       {"redis+sentinel://s1:26379", "redis+sentinel://s1:26379/", "redis+sentinel://:26379/m",
        "redis+sentinel://s1:0/m", "redis+sentinel://s1,,s2/m", "redis+sentinel://s1/m/x",
        "redis+sentinel://:secretpw@s1/m?color=red", "redis+sentinel://s1/m?sentinel_password"}) {
    auto ep = parse_redis_url(bad);
    EXPECT_FALSE(ep) << bad;
    if (!ep) {
      EXPECT_EQ(ep.error().find("secretpw"), std::string::npos) << ep.error();
    }
  }
}

using test::array_of;
using test::reply;

// nil is a miss, a bulk string a hit carrying the value.
TEST(RedisReplies, TakeNilAndString) {
  EXPECT_EQ(interpret_take_reply(reply(RedisReply::Type::nil)).kind, TakeResult::Kind::miss);
  auto hit = interpret_take_reply(reply(RedisReply::Type::string, R"({"a":1})"));
  EXPECT_EQ(hit.kind, TakeResult::Kind::hit);
  EXPECT_EQ(hit.params, R"({"a":1})");
}

// Error replies, wrong types and no reply at all are errors, never hits.
TEST(RedisReplies, TakeErrorsAndGarbage) {
  for (auto t : {RedisReply::Type::error, RedisReply::Type::status, RedisReply::Type::integer,
                 RedisReply::Type::array, RedisReply::Type::none}) {
    auto r = interpret_take_reply(reply(t, "x"));
    EXPECT_EQ(r.kind, TakeResult::Kind::error) << static_cast<int>(t);
    EXPECT_FALSE(r.detail.empty());
  }
}

// Only the status OK counts as a stored value.
TEST(RedisReplies, Put) {
  EXPECT_TRUE(interpret_put_reply(reply(RedisReply::Type::status, "OK")));
  EXPECT_FALSE(interpret_put_reply(reply(RedisReply::Type::status, "QUEUED")));
  EXPECT_FALSE(interpret_put_reply(reply(RedisReply::Type::string, "OK")));
  EXPECT_FALSE(interpret_put_reply(reply(RedisReply::Type::error, "OOM")));
  EXPECT_FALSE(interpret_put_reply(reply(RedisReply::Type::none, "timeout")));
}

// Redis < 6.2 answering GETDEL with "unknown command" is recognised.
TEST(RedisReplies, UnknownCommand) {
  EXPECT_TRUE(is_unknown_command_error(
      reply(RedisReply::Type::error, "ERR unknown command 'GETDEL', with args beginning with:")));
  EXPECT_FALSE(is_unknown_command_error(reply(RedisReply::Type::error, "WRONGTYPE")));
  EXPECT_FALSE(is_unknown_command_error(reply(RedisReply::Type::status, "ERR unknown command")));
}

// Keys are <prefix>conv:<id>.
// Reads replies from `bytes` with a bounded reader: the replies, and
// whether the reader failed.
struct ReadBack {
  std::vector<RedisReply> replies;
  bool error = false;
};
ReadBack read_back(const std::string& bytes) {
  ReadBack out;
  redisReader* r = redisReaderCreate();
  bound_reply_reader(r);
  redisReaderFeed(r, bytes.data(), bytes.size());
  for (;;) {
    void* reply = nullptr;
    if (redisReaderGetReply(r, &reply) != REDIS_OK) {
      out.error = true;
      break;
    }
    if (reply == nullptr)
      break;
    out.replies.push_back(copy_reply(static_cast<redisReply*>(reply)));
    freeReplyObject(reply);
  }
  redisReaderFree(r);
  return out;
}

// Found by fuzz_redis_reply: a reply declaring a billion elements made
// hiredis allocate 8 GB for them at once (ASan: out-of-memory). Refused
// now before any allocation, as a reader error (the connection ends).
TEST(RedisReplies, HugeDeclaredArrayIsRefused) {
  const auto huge = read_back("*1000000000\r\n");
  EXPECT_TRUE(huge.error);
  EXPECT_TRUE(huge.replies.empty());
  const auto nested = read_back("*2\r\n*" + std::to_string(kMaxReplyElements + 1) + "\r\n");
  EXPECT_TRUE(nested.error);
}

// Replies within the bounds read as before: arrays, strings, status,
// integers, nil, errors.
TEST(RedisReplies, BoundedReaderKeepsOrdinaryReplies) {
  const auto ok = read_back(
      "*3\r\n$7\r\nmessage\r\n$3\r\nch1\r\n$7\r\nchanged\r\n+OK\r\n:42\r\n$-1\r\n-ERR no\r\n");
  ASSERT_FALSE(ok.error);
  ASSERT_EQ(ok.replies.size(), 5u);
  EXPECT_EQ(ok.replies[0].type, RedisReply::Type::array);
  ASSERT_EQ(ok.replies[0].elements.size(), 3u);
  EXPECT_EQ(ok.replies[0].elements[2].text, "changed");
  EXPECT_TRUE(interpret_put_reply(ok.replies[1]));
  EXPECT_EQ(ok.replies[2].integer, 42);
  EXPECT_EQ(interpret_take_reply(ok.replies[3]).kind, TakeResult::Kind::miss);
  EXPECT_EQ(ok.replies[4].type, RedisReply::Type::error);
  const auto many = read_back("*1000\r\n" + [] {
    std::string s;
    for (int i = 0; i < 1000; ++i)
      s += ":1\r\n";
    return s;
  }());
  ASSERT_FALSE(many.error);
  EXPECT_EQ(many.replies.at(0).elements.size(), 1000u);
}

TEST(RedisKeys, Layout) {
  EXPECT_EQ(conversation_redis_key("pdgate:", "c-1"), "pdgate:conv:c-1");
}

// The reconnect delay doubles from the minimum up to the cap, and reset()
// starts over.
TEST(Backoff, DoublesAndCaps) {
  Backoff b(100ms, 5000ms);
  EXPECT_EQ(b.next(), 100ms);
  EXPECT_EQ(b.next(), 200ms);
  EXPECT_EQ(b.next(), 400ms);
  for (int i = 0; i < 100; ++i)
    EXPECT_LE(b.next(), 5000ms);
  EXPECT_EQ(b.next(), 5000ms);
  b.reset();
  EXPECT_EQ(b.next(), 100ms);
}

// One warning per interval; the next one reports how many were held back.
TEST(WarnLimiter, OnePerInterval) {
  WarnLimiter w(1000ms);
  std::uint64_t suppressed = 99;
  EXPECT_TRUE(w.allow(10'000, suppressed));
  EXPECT_EQ(suppressed, 0u);
  EXPECT_FALSE(w.allow(10'100, suppressed));
  EXPECT_FALSE(w.allow(10'999, suppressed));
  EXPECT_TRUE(w.allow(11'000, suppressed));
  EXPECT_EQ(suppressed, 2u);
}

// A command is RESP: an array of bulk strings, binary-safe.
TEST(Sentinel, RespCommand) {
  EXPECT_EQ(resp_command({"SENTINEL", "get-master-addr-by-name", "m"}),
            "*3\r\n$8\r\nSENTINEL\r\n$23\r\nget-master-addr-by-name\r\n$1\r\nm\r\n");
  EXPECT_EQ(resp_command({std::string_view("a\r\nb", 4)}), "*1\r\n$4\r\na\r\nb\r\n");
}

// get-master-addr-by-name: [host, port] is the master; nil, errors and
// malformed answers are errors saying so.
TEST(Sentinel, MasterAddressReply) {
  auto ok = interpret_master_address(array_of(
      {reply(RedisReply::Type::string, "10.0.0.5"), reply(RedisReply::Type::string, "6380")}));
  ASSERT_TRUE(ok) << ok.error();
  EXPECT_EQ(ok->host, "10.0.0.5");
  EXPECT_EQ(ok->port, 6380);
  auto unknown = interpret_master_address(reply(RedisReply::Type::nil));
  ASSERT_FALSE(unknown);
  EXPECT_NE(unknown.error().find("does not know"), std::string::npos);
  EXPECT_FALSE(interpret_master_address(reply(RedisReply::Type::error, "ERR no such")));
  EXPECT_FALSE(interpret_master_address(array_of({reply(RedisReply::Type::string, "h")})));
  EXPECT_FALSE(interpret_master_address(
      array_of({reply(RedisReply::Type::string, "h"), reply(RedisReply::Type::string, "99999")})));
  EXPECT_FALSE(interpret_master_address(
      array_of({reply(RedisReply::Type::string, ""), reply(RedisReply::Type::string, "6379")})));
}

// ROLE's first element says whether a server is the master; READONLY
// errors mean it was demoted.
TEST(Sentinel, RoleAndReadonly) {
  EXPECT_TRUE(is_master_role(array_of({reply(RedisReply::Type::string, "master")})));
  EXPECT_FALSE(is_master_role(array_of({reply(RedisReply::Type::string, "slave")})));
  EXPECT_FALSE(is_master_role(reply(RedisReply::Type::error, "ERR unknown command 'ROLE'")));
  EXPECT_TRUE(is_readonly_error(
      reply(RedisReply::Type::error, "READONLY You can't write against a read only replica.")));
  EXPECT_FALSE(is_readonly_error(reply(RedisReply::Type::error, "ERR wrong number")));
  EXPECT_FALSE(is_readonly_error(reply(RedisReply::Type::string, "READONLY")));
}

// +switch-master names the master, its old and its new address: only this
// master's switches count.
TEST(Sentinel, SwitchMasterMessage) {
  auto to = switch_master_target("mymaster 127.0.0.1 6379 127.0.0.1 6380", "mymaster");
  ASSERT_TRUE(to);
  EXPECT_EQ(to->host, "127.0.0.1");
  EXPECT_EQ(to->port, 6380);
  EXPECT_FALSE(switch_master_target("other 127.0.0.1 6379 127.0.0.1 6380", "mymaster"));
  EXPECT_FALSE(switch_master_target("mymaster 127.0.0.1 6379 127.0.0.1", "mymaster"));
  EXPECT_FALSE(switch_master_target("mymaster 127.0.0.1 6379 127.0.0.1 x", "mymaster"));
  EXPECT_FALSE(switch_master_target("mymaster a 1 b 2 c", "mymaster"));
}

RedisReply integers(std::vector<long long> v) {
  std::vector<RedisReply> items;
  for (long long n : v) {
    RedisReply r;
    r.type = RedisReply::Type::integer;
    r.integer = n;
    items.push_back(std::move(r));
  }
  return test::array_of(std::move(items));
}

// The policies' rate-limit script's reply is read only when it is the
// verdict the script gives: one integer per field, in range, and the
// overall answer agreeing with each limit's; anything else (Redis
// answers are not trusted) is no verdict, and the replica judges alone.
TEST(RateLimitReply, OnlyAConsistentVerdictIsRead) {
  const std::vector<RateLimitDecl> limits = {{"a", 3, 1000, ""}, {"b", 5, 60000, ""}};
  auto ok = interpret_rate_limit_reply(integers({1, 2, 0, 5, 0}), limits);
  ASSERT_TRUE(ok.has_value());
  EXPECT_TRUE((*ok)[0].allowed && (*ok)[1].allowed);
  EXPECT_EQ((*ok)[1].count, 5);
  auto refused = interpret_rate_limit_reply(integers({0, 3, 250, 1, 0}), limits);
  ASSERT_TRUE(refused.has_value());
  EXPECT_FALSE((*refused)[0].allowed);
  EXPECT_EQ((*refused)[0].retry_after_ms, 250);
  EXPECT_TRUE((*refused)[1].allowed);

  for (const auto& bad : {
           integers({1, 2, 0}),             // too short
           integers({1, 2, 0, 5, 0, 0}),    // too long
           integers({2, 2, 0, 5, 0}),       // verdict not 0/1
           integers({1, 3, 250, 1, 0}),     // says all fit, one does not
           integers({0, 2, 0, 1, 0}),       // says refused, all fit
           integers({0, 2, 250, 1, 0}),     // a wait on a limit with room
           integers({1, 4, 0, 1, 0}),       // counted past the limit
           integers({0, 3, 1001, 1, 0}),    // a wait past the window
           integers({1, -1, 0, 1, 0}),      // a negative count
           integers({0, 200000, 5, 1, 0}),  // past any limit
           test::array_of({test::string_reply("1"), test::string_reply("2")}),
           test::reply(RedisReply::Type::error, "ERR script"),
           test::reply(RedisReply::Type::none, "timed out"),
       }) {
    EXPECT_FALSE(interpret_rate_limit_reply(bad, limits).has_value());
  }
}

}  // namespace
}  // namespace pdgate
