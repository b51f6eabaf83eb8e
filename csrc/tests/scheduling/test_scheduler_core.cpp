// Deterministic tests of SchedulerCore: time is a VirtualClock the test steps, no threads.
#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <set>

#include "../check.hpp"
#include "latte/error.hpp"
#include "latte/scheduling/scheduler_core.hpp"

using namespace latte::scheduling;

namespace {

constexpr Nanos kMs = 1'000'000;

Request make(std::uint64_t id, const std::string& key, int priority = 0,
             Nanos deadline = kNoDeadline, std::uint64_t size = 1) {
  Request r;
  r.id = id;
  r.affinity_key = key;
  r.priority = priority;
  r.deadline = deadline;
  r.size = size;
  return r;
}

SchedulerConfig no_window(std::size_t lanes = 1, std::size_t max_batch = 8) {
  SchedulerConfig c;
  c.lanes = lanes;
  c.max_batch_size = max_batch;
  c.max_window = 0;
  return c;
}

std::vector<Outcome> all_ok(const Batch& b) {
  std::vector<Outcome> out;
  for (const QueuedRequest& q : b.requests) out.push_back(Outcome{q.request.id, true, {}, {}});
  return out;
}

std::vector<std::uint64_t> ids(const Batch& b) {
  std::vector<std::uint64_t> out;
  for (const QueuedRequest& q : b.requests) out.push_back(q.request.id);
  return out;
}

// Runs the next batch of `lane` to completion `cost` later and returns it.
Batch run(SchedulerCore& core, std::size_t lane, VirtualClock& clock, Nanos cost = kMs) {
  Decision d = core.next_batch(lane, clock.now());
  CHECK(d.kind == Decision::Kind::kRun);
  clock.advance(cost);
  core.complete(d.batch, all_ok(d.batch), clock.now());
  return d.batch;
}

}  // namespace

TEST_CASE("higher priority runs first, then earliest deadline first") {
  VirtualClock clock;
  SchedulerCore core(no_window(1, 1));
  CHECK(!core.submit(make(1, "k", 0, 5 * kMs), clock.now()));
  CHECK(!core.submit(make(2, "k", 1, 90 * kMs), clock.now()));
  CHECK(!core.submit(make(3, "k", 1, 40 * kMs), clock.now()));
  CHECK(!core.submit(make(4, "k", 0, 2 * kMs), clock.now()));
  std::vector<std::uint64_t> order;
  for (int i = 0; i < 4; ++i) order.push_back(run(core, 0, clock, 0).requests[0].request.id);
  CHECK((order == std::vector<std::uint64_t>{3, 2, 4, 1}));
}

TEST_CASE("priority decides between keys on one lane") {
  VirtualClock clock;
  SchedulerCore core(no_window(1));
  CHECK(!core.submit(make(1, "low", 0, 1 * kMs), clock.now()));
  CHECK(!core.submit(make(2, "high", 3), clock.now()));
  CHECK_EQ(run(core, 0, clock, 0).affinity_key, std::string("high"));
  CHECK_EQ(run(core, 0, clock, 0).affinity_key, std::string("low"));
}

TEST_CASE("a batch holds one key, up to the size and byte budgets") {
  VirtualClock clock;
  SchedulerConfig config = no_window(1, 3);
  config.max_batch_bytes = 10;
  SchedulerCore core(config);
  for (std::uint64_t i = 1; i <= 4; ++i) CHECK(!core.submit(make(i, "a", 0, kNoDeadline, 1), 0));
  CHECK(!core.submit(make(5, "b", 0, kNoDeadline, 1), 0));
  for (std::uint64_t i = 6; i <= 8; ++i) CHECK(!core.submit(make(i, "c", 0, kNoDeadline, 4), 0));
  std::map<std::string, std::vector<std::size_t>> sizes;
  while (core.queued() > 0) {
    Batch b = run(core, 0, clock);
    for (const QueuedRequest& q : b.requests) CHECK_EQ(q.request.affinity_key, b.affinity_key);
    CHECK(b.bytes <= 10);
    sizes[b.affinity_key].push_back(b.requests.size());
  }
  CHECK((sizes["a"] == std::vector<std::size_t>{3, 1}));
  CHECK((sizes["b"] == std::vector<std::size_t>{1}));
  CHECK((sizes["c"] == std::vector<std::size_t>{2, 1}));  // 4+4 bytes fit, a third does not
}

TEST_CASE("admission rejects at once, with the reason") {
  SchedulerConfig config = no_window(1);
  config.queue_capacity = 2;
  config.max_batch_bytes = 100;
  SchedulerCore core(config);
  const Nanos now = 50 * kMs;
  CHECK(core.submit(make(1, "k", 0, kNoDeadline, 101), now) == RejectReason::kTooLarge);
  CHECK(core.submit(make(2, "k", 0, now), now) == RejectReason::kDeadlinePassed);
  CHECK(!core.submit(make(3, "k", 1), now));
  CHECK(!core.submit(make(4, "k", 1), now));
  CHECK(core.submit(make(5, "k", 1), now) == RejectReason::kQueueFull);
  CHECK(core.submit(make(6, "k", 0), now) == RejectReason::kQueueFull);
  // Admission refusals are answered by submit's return, never again later.
  CHECK(core.take_rejections().empty());
  MetricsSnapshot m = core.metrics();
  CHECK_EQ(m.rejections["too_large"], 1u);
  CHECK_EQ(m.rejections["deadline_passed"], 1u);
  CHECK_EQ(m.rejections["queue_full"], 2u);
  CHECK_EQ(m.queue_depth[1], 2u);
}

TEST_CASE("a full queue makes room for higher priority by displacing the least urgent") {
  SchedulerConfig config = no_window(2);
  config.queue_capacity = 3;
  SchedulerCore core(config);
  CHECK(!core.submit(make(1, "a", 0, 10 * kMs), 0));
  CHECK(!core.submit(make(2, "b", 0, 20 * kMs), 0));
  CHECK(!core.submit(make(3, "a", 1), 0));
  CHECK(!core.submit(make(4, "c", 2), 0));
  std::vector<Outcome> displaced = core.take_rejections();
  CHECK_EQ(displaced.size(), 1u);
  CHECK_EQ(displaced[0].id, 2u);  // lowest priority, latest deadline
  CHECK(displaced[0].reason == RejectReason::kDisplaced);
  CHECK(core.take_rejections().empty());  // reported once
  CHECK(!core.has_group("b"));
  CHECK_EQ(core.queued(), 3u);
}

TEST_CASE("malformed requests raise logic_error naming the problem") {
  SchedulerCore core(no_window(1));
  CHECK_THROWS_AS(core.submit(make(1, ""), 0), latte::logic_error);
  CHECK_THROWS_AS(core.submit(make(1, "k", kPriorityLevels), 0), latte::logic_error);
  CHECK_THROWS_AS(core.submit(make(1, "k", -1), 0), latte::logic_error);
  CHECK(!core.submit(make(7, "k"), 0));
  CHECK_THROWS_AS(core.submit(make(7, "k"), 0), latte::logic_error);  // id still open
  CHECK_THROWS_AS(core.next_batch(3, 0), latte::logic_error);
  bool named = false;
  try {
    core.submit(make(2, "k", kPriorityLevels + 1), 0);
  } catch (const latte::logic_error& e) {
    named = std::string(e.what()).find("priority must be in [0, 15], got 17") != std::string::npos;
  }
  CHECK(named);
  SchedulerConfig bad;
  bad.max_batch_size = 0;
  CHECK_THROWS_AS(SchedulerCore{bad}, latte::logic_error);
}

TEST_CASE("an id can be reused once its request was answered") {
  VirtualClock clock;
  SchedulerCore core(no_window(1));
  CHECK(!core.submit(make(1, "k"), 0));
  run(core, 0, clock);
  CHECK(!core.submit(make(1, "k"), clock.now()));
}

TEST_CASE("requests whose deadline passes in the queue are rejected once, never run") {
  VirtualClock clock;
  SchedulerCore core(no_window(1, 1));
  CHECK(!core.submit(make(1, "k", 0, 3 * kMs), 0));
  CHECK(!core.submit(make(2, "k", 0, 30 * kMs), 0));
  clock.set(5 * kMs);
  Batch b = run(core, 0, clock);
  CHECK((ids(b) == std::vector<std::uint64_t>{2}));
  std::vector<Outcome> expired = core.take_rejections();
  CHECK_EQ(expired.size(), 1u);
  CHECK_EQ(expired[0].id, 1u);
  CHECK(expired[0].reason == RejectReason::kDeadlineExpired);
  CHECK(core.take_rejections().empty());
  // A named snapshot: CHECK_EQ binds its operands by reference, past a temporary's lifetime.
  const auto snapshot = core.metrics();
  CHECK_EQ(snapshot.rejections.at("deadline_expired"), 1u);
}

TEST_CASE("a request that cannot finish by its deadline even alone is rejected, not run") {
  SchedulerCore core(no_window(1, 2));
  core.seed_latency("k", 1, 4 * kMs);
  core.seed_latency("k", 2, 9 * kMs);
  CHECK(!core.submit(make(1, "k", 1, 3 * kMs), 0));  // needs at least 4 ms, has 3
  CHECK(!core.submit(make(2, "k", 0, 5 * kMs), 0));  // fits
  Decision d = core.next_batch(0, 0);
  CHECK(d.kind == Decision::Kind::kRun);
  CHECK((ids(d.batch) == std::vector<std::uint64_t>{2}));
  std::vector<Outcome> rejected = core.take_rejections();
  CHECK_EQ(rejected.size(), 1u);
  CHECK(rejected[0].id == 1 && rejected[0].reason == RejectReason::kDeadlineExpired);
}

TEST_CASE("a key returns to the lane that last ran it") {
  VirtualClock clock;
  SchedulerCore core(no_window(2));
  CHECK(!core.submit(make(1, "a"), 0));
  CHECK(!core.submit(make(2, "b"), 0));
  CHECK_EQ(core.lane_of("a"), 0u);
  CHECK_EQ(core.lane_of("b"), 1u);  // new keys go to the least loaded lane
  run(core, 0, clock);
  run(core, 1, clock);
  // "b" goes home to lane 1 although lane 0 is just as idle.
  CHECK(!core.submit(make(3, "b"), clock.now()));
  CHECK_EQ(core.lane_of("b"), 1u);
  Batch b = run(core, 1, clock);
  CHECK(b.affinity_hit);
  MetricsSnapshot m = core.metrics();
  CHECK_EQ(m.affinity_eligible, 1u);
  CHECK_EQ(m.affinity_hits, 1u);
}

TEST_CASE("a key leaves its home lane when that lane is overloaded") {
  VirtualClock clock;
  SchedulerConfig config = no_window(2);
  config.placement_slack = 2;
  SchedulerCore core(config);
  CHECK(!core.submit(make(1, "a"), 0));
  run(core, 0, clock);  // "a" lives on lane 0 now
  CHECK(!core.submit(make(2, "a"), clock.now()));
  Decision running = core.next_batch(0, clock.now());  // lane 0 busy with "a"
  CHECK(running.kind == Decision::Kind::kRun);
  for (std::uint64_t i = 10; i < 13; ++i) CHECK(!core.submit(make(i, "hot"), clock.now()));
  CHECK_EQ(core.lane_of("hot"), 1u);
  // Lane 0 (load 1) is within slack of lane 1 (load 3): "b" has no home; "a" has home 0.
  CHECK(!core.submit(make(3, "a"), clock.now()));
  CHECK_EQ(core.lane_of("a"), 0u);
  core.complete(running.batch, all_ok(running.batch), clock.now());
  run(core, 0, clock);
  // Now pile work onto lane 0 under another key so that "a" must go elsewhere.
  for (std::uint64_t i = 20; i < 26; ++i) CHECK(!core.submit(make(i, "other0", 0), clock.now()));
  CHECK_EQ(core.lane_of("other0"), 0u);
  CHECK(!core.submit(make(4, "a"), clock.now()));
  CHECK_EQ(core.lane_of("a"), 1u);
}

TEST_CASE("an idle lane steals a whole group, preferring keys the victim did not run lately") {
  VirtualClock clock;
  SchedulerCore core(no_window(2));
  CHECK(!core.submit(make(1, "a"), 0));
  Decision busy = core.next_batch(0, 0);  // lane 0 runs "a"
  CHECK(busy.kind == Decision::Kind::kRun);
  CHECK(!core.submit(make(2, "c"), 0));
  CHECK_EQ(core.lane_of("c"), 1u);
  CHECK(!core.submit(make(3, "b"), 0));
  CHECK_EQ(core.lane_of("b"), 0u);  // tie on load, lowest lane
  CHECK(!core.submit(make(4, "a", 0, 10 * kMs), 0));
  CHECK(!core.submit(make(5, "a"), 0));
  CHECK_EQ(core.lane_of("a"), 0u);
  run(core, 1, clock);  // lane 1 runs its own "c" first
  Decision stolen = core.next_batch(1, clock.now());
  CHECK(stolen.kind == Decision::Kind::kRun);
  // "a" is more urgent but warm on lane 0, so the thief takes "b".
  CHECK_EQ(stolen.batch.affinity_key, std::string("b"));
  CHECK(stolen.batch.stolen);
  CHECK_EQ(core.metrics().steals, 1u);
  core.complete(stolen.batch, all_ok(stolen.batch), clock.now());
  core.complete(busy.batch, all_ok(busy.batch), clock.now());
  Decision home = core.next_batch(0, clock.now());
  CHECK((ids(home.batch) == std::vector<std::uint64_t>{4, 5}));
  CHECK(home.batch.affinity_hit);
}

TEST_CASE("a thief takes higher-priority work first, even if it is warm on the victim") {
  VirtualClock clock;
  SchedulerCore core(no_window(2));
  CHECK(!core.submit(make(1, "a"), 0));
  Decision busy = core.next_batch(0, 0);  // lane 0 runs "a": "a" is warm there
  CHECK(!core.submit(make(2, "c"), 0));   // lane 1
  CHECK(!core.submit(make(3, "b", 0), 0));
  CHECK(!core.submit(make(4, "a", 2), 0));
  CHECK_EQ(core.lane_of("b"), 0u);
  CHECK_EQ(core.lane_of("a"), 0u);
  run(core, 1, clock);
  Decision stolen = core.next_batch(1, clock.now());
  CHECK_EQ(stolen.batch.affinity_key, std::string("a"));
  (void)busy;
}

TEST_CASE("placement counts only the work that runs before the request") {
  SchedulerConfig config = no_window(2);
  config.placement_slack = 1;
  SchedulerCore core(config);
  CHECK(!core.submit(make(1, "a", 2), 0));
  Decision d = core.next_batch(0, 0);
  VirtualClock clock;
  clock.advance(kMs);
  core.complete(d.batch, all_ok(d.batch), clock.now());  // "a" is at home on lane 0
  for (std::uint64_t i = 10; i < 14; ++i) CHECK(!core.submit(make(i, "low", 0), clock.now()));
  CHECK_EQ(core.lane_of("low"), 0u);
  // Four low-priority requests on lane 0 do not run before a priority-2 request.
  CHECK(!core.submit(make(2, "a", 2), clock.now()));
  CHECK_EQ(core.lane_of("a"), 0u);
}

TEST_CASE("no stealing from a lane that can start its only group itself") {
  SchedulerCore core(no_window(2));
  CHECK(!core.submit(make(1, "a"), 0));
  CHECK(!core.submit(make(2, "a"), 0));
  CHECK(core.next_batch(1, 0).kind == Decision::Kind::kIdle);
  CHECK_EQ(core.lane_of("a"), 0u);
}

TEST_CASE("no stealing of a lone request: it is worth waiting for its warm lane") {
  SchedulerCore core(no_window(2));
  CHECK(!core.submit(make(1, "a"), 0));
  Decision busy = core.next_batch(0, 0);
  CHECK(!core.submit(make(2, "a"), 0));
  CHECK(core.next_batch(1, 0).kind == Decision::Kind::kIdle);
  CHECK(!core.submit(make(3, "a"), 0));
  CHECK(core.next_batch(1, 0).kind == Decision::Kind::kRun);  // two queued: now it pays
}

TEST_CASE("latency model fits a*n + b") {
  LatencyModel model;
  CHECK(!model.ready());
  for (int n = 1; n <= 8; ++n) model.record(n, 5 * kMs + n * kMs);
  CHECK(model.ready());
  CHECK(std::abs(model.per_item() - kMs) < 1.0);
  CHECK(std::abs(model.fixed() - 5 * kMs) < 10.0);
  CHECK_EQ(model.predict(4), 9 * kMs);
  LatencyModel one_size;
  one_size.record(2, 4 * kMs);
  one_size.record(2, 4 * kMs);
  CHECK_EQ(one_size.fixed(), 0.0);  // cannot tell a fixed cost from one batch size
}

namespace {

struct SimulationResult {
  std::size_t batches = 0, completed = 0, expired = 0, waits = 0, timeouts = 0;
  Nanos busy = 0;
  Nanos total_latency = 0;
  Nanos first_wait_start = -1;
};

// One lane, batch cost a*n + b on the virtual clock, arrivals at the given times.
SimulationResult simulate(SchedulerConfig config, const std::vector<Nanos>& arrivals,
                          Nanos deadline, Nanos per_item, Nanos fixed) {
  SchedulerCore core(config);
  SimulationResult result;
  std::size_t next = 0;
  Nanos now = 0;
  auto admit_until = [&](Nanos t) {
    for (; next < arrivals.size() && arrivals[next] <= t; ++next) {
      CHECK(!core.submit(make(next, "k", 0, arrivals[next] + deadline), arrivals[next]));
    }
  };
  while (true) {
    admit_until(now);
    Decision d = core.next_batch(0, now);
    if (d.kind == Decision::Kind::kRun) {
      const Nanos cost = per_item * static_cast<Nanos>(d.batch.requests.size()) + fixed;
      now += cost;
      admit_until(now);
      core.complete(d.batch, all_ok(d.batch), now);
      ++result.batches;
      result.busy += cost;
      result.timeouts += d.batch.flushed_by_timeout;
      for (const QueuedRequest& q : d.batch.requests) {
        result.total_latency += now - q.submitted;
        ++result.completed;
      }
    } else if (d.kind == Decision::Kind::kWait) {
      CHECK(d.wake_at > now);
      ++result.waits;
      if (result.first_wait_start < 0) result.first_wait_start = now;
      now = next < arrivals.size() ? std::min(d.wake_at, arrivals[next]) : d.wake_at;
    } else if (next < arrivals.size()) {
      now = arrivals[next];
    } else {
      break;
    }
  }
  result.expired = core.take_rejections().size();
  return result;
}

std::vector<Nanos> poisson(double per_ms, std::size_t count, unsigned seed, Nanos start = 0) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(per_ms);
  std::vector<Nanos> out;
  double t = static_cast<double>(start);
  for (std::size_t i = 0; i < count; ++i) {
    t += gap(rng) * kMs;
    out.push_back(static_cast<Nanos>(t));
  }
  return out;
}

}  // namespace

TEST_CASE("adaptive window adds no wait at trickle load") {
  SchedulerConfig config;
  config.max_window = 5 * kMs;
  // A busy minute first (the model learns a large fixed cost), then a trickle.
  std::vector<Nanos> arrivals = poisson(1.0, 2000, 7);
  const Nanos quiet_start = arrivals.back() + 1000 * kMs;
  for (int i = 0; i < 50; ++i) arrivals.push_back(quiet_start + i * 40 * kMs);
  SchedulerCore probe(config);
  SimulationResult trickle_only = simulate(config, {arrivals.end() - 50, arrivals.end()},
                                           100 * kMs, kMs / 5, 2 * kMs);
  CHECK_EQ(trickle_only.waits, 0u);
  // With the busy phase before it the window does wait during the busy phase only.
  SimulationResult both = simulate(config, arrivals, 100 * kMs, kMs / 5, 2 * kMs);
  CHECK(both.waits > 0);
  SchedulerConfig busy_only = config;
  SimulationResult busy = simulate(busy_only, {arrivals.begin(), arrivals.end() - 50},
                                   100 * kMs, kMs / 5, 2 * kMs);
  CHECK_EQ(both.waits, busy.waits);  // not a single wait was added for the trickle
}

TEST_CASE("adaptive window waits at high load, and it pays off") {
  // 1 request/ms against a batch cost of 0.2 ms per request + 2 ms per batch: batches of one
  // could not keep up; dispatching greedily settles at a lane that is never idle.
  const std::vector<Nanos> arrivals = poisson(1.0, 4000, 11);
  SchedulerConfig greedy;
  greedy.max_window = 0;
  SchedulerConfig adaptive;
  adaptive.max_window = 5 * kMs;
  const Nanos deadline = 50 * kMs;
  SimulationResult g = simulate(greedy, arrivals, deadline, kMs / 5, 2 * kMs);
  SimulationResult a = simulate(adaptive, arrivals, deadline, kMs / 5, 2 * kMs);
  std::printf("     greedy: %zu batches, busy %.1f ms, mean latency %.2f ms, expired %zu\n",
              g.batches, g.busy / 1e6, g.total_latency / 1e6 / g.completed, g.expired);
  std::printf("     adaptive: %zu batches, busy %.1f ms, mean latency %.2f ms, expired %zu, "
              "waits %zu, timeouts %zu\n",
              a.batches, a.busy / 1e6, a.total_latency / 1e6 / a.completed, a.expired, a.waits,
              a.timeouts);
  CHECK(a.waits > 0);
  CHECK_EQ(a.expired, 0u);
  CHECK_EQ(a.completed, arrivals.size());
  // Larger batches free lane time for other keys: at least 15% less busy time.
  CHECK(a.batches < g.batches);
  CHECK(static_cast<double>(a.busy) < 0.85 * static_cast<double>(g.busy));
}

namespace {

// A lane busy with key "x" while four requests of "k" arrive 1 ms apart; "k" costs
// 0.1 ms per request + 4 ms per batch, so at 1 request/ms the window aims for batches of 6.
SchedulerCore held_group_after_busy_lane(Batch* running) {
  SchedulerConfig config;
  config.max_window = 50 * kMs;
  SchedulerCore core(config);
  core.seed_latency("k", 1, 4 * kMs + kMs / 10);
  core.seed_latency("k", 8, 4 * kMs + 8 * kMs / 10);
  CHECK(!core.submit(make(100, "x"), 0));
  Decision x = core.next_batch(0, 0);
  CHECK(x.kind == Decision::Kind::kRun);
  *running = x.batch;
  for (std::uint64_t i = 0; i < 4; ++i) CHECK(!core.submit(make(i, "k"), i * kMs));
  return core;
}

}  // namespace

TEST_CASE("the window waits for the batch size the arrival rate calls for") {
  Batch x;
  SchedulerCore core = held_group_after_busy_lane(&x);
  CHECK(!core.submit(make(4, "k"), 4 * kMs));
  core.complete(x, all_ok(x), 4 * kMs);
  CHECK_EQ(core.target_batch_size("k", 4 * kMs), 6u);
  Decision d = core.next_batch(0, 4 * kMs);
  CHECK(d.kind == Decision::Kind::kWait);
  CHECK_EQ(d.wake_at, 5 * kMs);  // one more request expected in 1 ms
  CHECK(!core.submit(make(5, "k"), 4 * kMs + 9 * kMs / 10));
  Decision full = core.next_batch(0, 4 * kMs + 9 * kMs / 10);
  CHECK(full.kind == Decision::Kind::kRun);
  CHECK_EQ(full.batch.requests.size(), 6u);
  CHECK(!full.batch.flushed_by_timeout);
}

TEST_CASE("the window never holds a batch past what its deadlines allow") {
  Batch x;
  SchedulerCore core = held_group_after_busy_lane(&x);
  const Nanos deadline = 4 * kMs + 5 * kMs + kMs / 5;
  CHECK(!core.submit(make(4, "k", 0, deadline), 4 * kMs));
  core.complete(x, all_ok(x), 4 * kMs);
  Decision d = core.next_batch(0, 4 * kMs);
  CHECK(d.kind == Decision::Kind::kWait);
  // A batch of 6 takes 4.6 ms, so it must start by the deadline minus that, before the 5 ms
  // the arrival rate alone would suggest.
  CHECK_EQ(d.wake_at, deadline - core.latency_model("k")->predict(6));
  Decision flushed = core.next_batch(0, d.wake_at);
  CHECK(flushed.kind == Decision::Kind::kRun);
  CHECK_EQ(flushed.batch.requests.size(), 5u);
  CHECK(flushed.batch.flushed_by_timeout);
  CHECK_EQ(core.metrics().batches_flushed_by_timeout, 1u);
}

TEST_CASE("metrics count batches by size and keep latency percentiles per priority") {
  VirtualClock clock;
  SchedulerCore core(no_window(1, 4));
  for (std::uint64_t i = 0; i < 3; ++i) CHECK(!core.submit(make(i, "k", 1), clock.now()));
  CHECK(!core.submit(make(9, "j", 0), clock.now()));
  CHECK_EQ(core.metrics().queue_depth[1], 3u);
  CHECK_EQ(core.metrics().queue_depth[0], 1u);
  run(core, 0, clock, 2 * kMs);
  run(core, 0, clock, 2 * kMs);
  MetricsSnapshot m = core.metrics();
  CHECK_EQ(m.batches, 2u);
  CHECK_EQ(m.batch_size_histogram[3], 1u);
  CHECK_EQ(m.batch_size_histogram[1], 1u);
  CHECK_EQ(m.latency[1].count, 3u);
  CHECK(std::abs(m.latency[1].p99 - 0.002) < 1e-9);
  CHECK(std::abs(m.latency[0].p50 - 0.004) < 1e-9);
  CHECK_EQ(m.completed, 4u);
}

TEST_CASE("seeded random operations keep every request answered exactly once") {
  std::mt19937 rng(1234);
  SchedulerConfig config;
  config.lanes = 3;
  config.queue_capacity = 40;
  config.max_window = 3 * kMs;
  SchedulerCore core(config);
  std::map<std::uint64_t, int> answers;
  std::uint64_t next_id = 0;
  std::vector<std::optional<Batch>> running(config.lanes);
  Nanos now = 0;
  auto answer = [&](std::uint64_t id) { ++answers[id]; };
  for (int step = 0; step < 20000; ++step) {
    now += static_cast<Nanos>(rng() % (kMs / 2));
    const int op = static_cast<int>(rng() % 3);
    if (op == 0) {
      std::uint64_t id = next_id++;
      Request r = make(id, "k" + std::to_string(rng() % 6), static_cast<int>(rng() % 3),
                       now + static_cast<Nanos>(rng() % (20 * kMs)), 1 + rng() % 64);
      if (auto refusal = core.submit(r, now)) answer(id);
      answers.emplace(id, 0);
    } else {
      const std::size_t lane = rng() % config.lanes;
      if (running[lane]) {
        std::vector<Outcome> outcomes = all_ok(*running[lane]);
        if (rng() % 10 == 0) {
          for (Outcome& o : outcomes) o.ok = false, o.reason = RejectReason::kExecuteFailed;
        }
        core.complete(*running[lane], outcomes, now);
        for (const Outcome& o : outcomes) answer(o.id);
        running[lane].reset();
      } else {
        Decision d = core.next_batch(lane, now);
        if (d.kind == Decision::Kind::kRun) running[lane] = d.batch;
      }
    }
    for (const Outcome& o : core.take_rejections()) answer(o.id);
  }
  for (auto& slot : running) {
    if (slot) {
      core.complete(*slot, all_ok(*slot), now);
      for (const QueuedRequest& q : slot->requests) answer(q.request.id);
    }
  }
  core.reject_all(RejectReason::kShutdown);
  for (const Outcome& o : core.take_rejections()) answer(o.id);
  CHECK_EQ(core.queued(), 0u);
  for (const auto& [id, count] : answers) {
    if (count != 1) {
      std::printf("     request %llu answered %d times\n", static_cast<unsigned long long>(id), count);
    }
    CHECK_EQ(count, 1);
  }
  CHECK(core.metrics().steals > 0);
}

int main() { return latte::testing::run_all(); }
