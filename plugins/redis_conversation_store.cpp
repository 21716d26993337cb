#include "plugins/redis_conversation_store.hpp"
#include "core/base/clock.hpp"

#include <spdlog/spdlog.h>

namespace pdgate {

namespace {

// GET then DEL as one script: atomic like GETDEL, for servers before 6.2.
constexpr std::string_view kTakeScript =
    "local v = redis.call('GET', KEYS[1]) if v then redis.call('DEL', KEYS[1]) end return v";

class RedisConversationStore final : public ConversationStore {
 public:
  RedisConversationStore(RedisConversationStores& shared, net::any_io_executor ex)
      : shared_(shared),
        conn_(RedisConnection::create(std::move(ex), shared.settings(), shared.connections())) {
    conn_->start();
  }
  ~RedisConversationStore() override { conn_->stop(); }

  net::awaitable<TakeResult> take(std::string conversation_id) override {
    const std::string key = conversation_redis_key(shared_.options().key_prefix, conversation_id);
    RedisReply reply = co_await run_take(key);
    if (is_unknown_command_error(reply) && !shared_.use_script().exchange(true)) {
      spdlog::info("redis {}: no GETDEL (Redis < 6.2); taking entries with a GET+DEL script",
                   shared_.settings().endpoint.display());
      reply = co_await run_take(key);
    }
    TakeResult r = interpret_take_reply(reply);
    auto& c = shared_.counters();
    switch (r.kind) {
      case TakeResult::Kind::hit:
        break;  // judged (and counted) by the caller
      case TakeResult::Kind::miss:
        c.add(c.misses_none);
        break;
      case TakeResult::Kind::error:
        c.add(c.errors);
        warn("take", r.detail);
        break;
    }
    co_return r;
  }

  net::awaitable<bool> put(std::string conversation_id, std::string params_json,
                           std::chrono::seconds ttl) override {
    if (params_json.size() > shared_.options().max_value_bytes)
      co_return false;
    const std::string key = conversation_redis_key(shared_.options().key_prefix, conversation_id);
    const std::string seconds = std::to_string(std::max<std::int64_t>(ttl.count(), 1));
    // Named vectors: GCC 12 miscompiles braced lists of literals inside a
    // co_await expression ("array used as initializer").
    std::vector<std::string_view> args{std::string_view("SET"), key, params_json,
                                       std::string_view("EX"), seconds};
    RedisReply reply = co_await conn_->command(std::move(args));
    auto& c = shared_.counters();
    if (!interpret_put_reply(reply)) {
      c.add(c.errors);
      warn("put", reply.text.empty() ? "unexpected reply" : reply.text);
      co_return false;
    }
    c.add(c.puts);
    co_return true;
  }

 private:
  net::awaitable<RedisReply> run_take(const std::string& key) {
    std::vector<std::string_view> args;
    if (shared_.use_script().load(std::memory_order_relaxed)) {
      args = {std::string_view("EVAL"), kTakeScript, std::string_view("1"), key};
    } else {
      args = {std::string_view("GETDEL"), key};
    }
    co_return co_await conn_->command(std::move(args));
  }

  void warn(const char* op, const std::string& why) {
    std::uint64_t suppressed = 0;
    if (!shared_.warnings().allow(steady_now_ms(), suppressed))
      return;
    spdlog::warn(
        "conversation store {} on redis {} failed: {}; the turn proceeds as a cache miss "
        "({} similar warnings suppressed)",
        op, shared_.settings().endpoint.display(), why, suppressed);
  }

  RedisConversationStores& shared_;
  std::shared_ptr<RedisConnection> conn_;
};

}  // namespace

RedisConversationStores::RedisConversationStores(const ConversationStoreOptions& options,
                                                 RedisEndpoint endpoint, RedisClientContext context)
    : options_(options) {
  settings_.endpoint = std::move(endpoint);
  settings_.context = std::move(context);
  settings_.command_timeout = options.redis_timeout;
  settings_.connect_timeout = options.redis_connect_timeout;
  settings_.reconnect_min = options.reconnect_min;
  settings_.reconnect_max = options.reconnect_max;
}

std::unique_ptr<ConversationStore> RedisConversationStores::make_handle(
    net::any_io_executor worker) {
  return std::make_unique<RedisConversationStore>(*this, std::move(worker));
}

ConversationStoreHealth RedisConversationStores::health() const {
  return {"redis", settings_.endpoint.display(),
          connections_.ready_connections.load(std::memory_order_relaxed) > 0, std::nullopt};
}

}  // namespace pdgate
