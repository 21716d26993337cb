// The retry rules (core/pipeline/failover.hpp): a request that never reached
// an engine may go elsewhere a few times for free; any other retry takes
// one unit of the shared retry budget, once per request, and gives it back
// when it ends.
#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>

#include "core/pipeline/failover.hpp"
#include "core/pipeline/worker.hpp"

namespace pdgate {
namespace {

struct NoPicker final : InstancePicker {
  InstancePtr pick(const std::vector<InstancePtr>&, const PickContext&) override { return {}; }
};

struct Fixture {
  explicit Fixture(double budget, std::int64_t active_requests) : active(active_requests) {
    cfg.retry_budget = budget;
    w.metrics = &metrics;
  }
  boost::asio::io_context io;
  Config cfg;
  Registry registry{cfg};
  std::atomic<std::int64_t> active;
  GatewayMetrics metrics;
  WorkerContext w{cfg, registry, std::make_unique<NoPicker>(), io.get_executor(), "", active};
};

GatewayError engine_error(bool reached) {
  GatewayError e;
  e.kind = reached ? ErrorKind::engine_failed : ErrorKind::connect_failed;
  e.source = ErrorSource::engine;
  e.retriable = true;
  e.reached_engine = reached;
  return e;
}

// A failure that is not retriable (a 4xx, a stream cut after its first
// byte) is never retried, and takes nothing.
TEST(Failover, NotRetriableIsNeverRetried) {
  Fixture f(1.0, 10);
  Failover fo(f.w);
  auto e = engine_error(true);
  e.retriable = false;
  EXPECT_FALSE(fo.may_retry(Stage::decode, e));
  EXPECT_EQ(f.metrics.retries_decode.load(), 0u);
  EXPECT_EQ(f.metrics.retries_in_flight.load(), 0);
}

// Never-sent retries cost no budget: three per stage, even with the
// budget at zero; the fourth needs the budget like any other.
TEST(Failover, NeverSentRetriesAreFreeThreePerStage) {
  Fixture f(0.0, 1);
  // Someone else holds the only budget unit.
  f.metrics.retries_in_flight = 1;
  Failover fo(f.w);
  for (int i = 0; i < Failover::kNeverSentRetries; ++i) {
    EXPECT_TRUE(fo.may_retry(Stage::prefill, engine_error(false)));
    EXPECT_TRUE(fo.may_retry(Stage::decode, engine_error(false)));
  }
  EXPECT_FALSE(fo.may_retry(Stage::prefill, engine_error(false)));
  EXPECT_EQ(f.metrics.retries_prefill.load(), 3u);
  EXPECT_EQ(f.metrics.retries_decode.load(), 3u);
  EXPECT_EQ(f.metrics.retries_refused.load(), 1u);
  EXPECT_EQ(f.metrics.retries_in_flight.load(), 1);
}

// A retry of a request an engine received takes one budget unit; the
// same request may not take a second; release() gives the unit back.
TEST(Failover, OneBudgetedRetryPerRequest) {
  Fixture f(0.5, 10);  // budget: 5 retries in flight
  {
    Failover fo(f.w);
    EXPECT_TRUE(fo.may_retry(Stage::prefill, engine_error(true)));
    EXPECT_EQ(f.metrics.retries_in_flight.load(), 1);
    EXPECT_FALSE(fo.may_retry(Stage::decode, engine_error(true)));
    fo.release();
    EXPECT_EQ(f.metrics.retries_in_flight.load(), 0);
    EXPECT_FALSE(fo.may_retry(Stage::decode, engine_error(true)))
        << "the request already had its budgeted retry";
  }
  EXPECT_EQ(f.metrics.retries_in_flight.load(), 0);
}

// Retries in flight stay under budget x requests in flight (at least
// one); past it they are refused and counted; units come back as the
// retries end (the destructor releases).
TEST(Failover, BudgetBoundsRetriesInFlight) {
  Fixture f(0.2, 20);  // 4 retries in flight at most
  std::vector<std::unique_ptr<Failover>> requests;
  int granted = 0;
  for (int i = 0; i < 10; ++i) {
    requests.push_back(std::make_unique<Failover>(f.w));
    if (requests.back()->may_retry(Stage::decode, engine_error(true)))
      ++granted;
  }
  EXPECT_EQ(granted, 4);
  EXPECT_EQ(f.metrics.retries_refused.load(), 6u);
  EXPECT_EQ(f.metrics.retries_in_flight.load(), 4);
  requests.clear();
  EXPECT_EQ(f.metrics.retries_in_flight.load(), 0);

  // Few requests in flight: the budget is still one.
  Fixture small(0.2, 1);
  Failover a(small.w), b(small.w);
  EXPECT_TRUE(a.may_retry(Stage::decode, engine_error(true)));
  EXPECT_FALSE(b.may_retry(Stage::decode, engine_error(true)));
}

// untried() and has_alternative(): a retry goes only to instances not
// tried yet, and only if a healthy one is left.
TEST(Failover, AlternativesExcludeTriedAndEjected) {
  std::vector<InstancePtr> list;
  for (std::uint64_t id = 1; id <= 3; ++id) {
    list.push_back(std::make_shared<Instance>(
        id, *parse_upstream(Role::decode, "127.0.0.1:" + std::to_string(8200 + id))));
  }
  std::vector<const Instance*> tried = {list[0].get()};
  EXPECT_EQ(untried(list, tried).size(), 2u);
  EXPECT_TRUE(has_alternative(list, tried));
  list[1]->healthy = false;
  EXPECT_TRUE(has_alternative(list, tried));
  tried.push_back(list[2].get());
  EXPECT_FALSE(has_alternative(list, tried)) << "only an ejected one is left";
  EXPECT_EQ(untried(list, tried).size(), 1u);
}

// What a retry's pick reads in ctx.failed.kind.
TEST(Failover, FailureKinds) {
  GatewayError e;
  e.kind = ErrorKind::connect_failed;
  EXPECT_EQ(failure_kind(e), "connect");
  e.kind = ErrorKind::timed_out;
  EXPECT_EQ(failure_kind(e), "timeout");
  e.kind = ErrorKind::engine_failed;
  e.engine_status = 503;
  EXPECT_EQ(failure_kind(e), "status_503");
  PickRetries r;
  auto inst = std::make_shared<Instance>(7, UpstreamSpec{});
  note_attempt_failed(r, Stage::decode, inst, e);
  note_attempt_failed(r, Stage::decode, inst, e);
  EXPECT_EQ(r.failed_attempts[static_cast<int>(Stage::decode)], 2u);
  EXPECT_EQ(r.failed_attempts[static_cast<int>(Stage::prefill)], 0u);
  ASSERT_TRUE(r.last[static_cast<int>(Stage::decode)]);
  EXPECT_EQ(r.last[static_cast<int>(Stage::decode)]->status, 503u);
  EXPECT_EQ(r.last[static_cast<int>(Stage::decode)]->instance->id, 7u);
}

}  // namespace
}  // namespace pdgate
