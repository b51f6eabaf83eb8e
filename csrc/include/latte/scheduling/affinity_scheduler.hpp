#pragma once
// SchedulerCore driven by one native thread per lane. Each lane is pinned to its CPU set and
// runs the batches the core hands it; every request's outcome is reported exactly once.
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "latte/scheduling/clock.hpp"
#include "latte/scheduling/cpu_pinning.hpp"
#include "latte/scheduling/scheduler_core.hpp"

namespace latte::scheduling {

// Runs one batch on the calling lane thread; throwing fails every request of the batch.
using ExecuteFn = std::function<void(const Batch&)>;
// Told about the batch the lane expects to run next, just before the current one starts; a
// hint for staging inputs asynchronously, so it must not block.
using PrefetchFn = std::function<void(const Batch&)>;
// Receives outcomes in groups (a batch, or rejections found together); never under the lock.
using CompletionFn = std::function<void(const std::vector<Outcome>&)>;

class AffinityScheduler {
 public:
  // lane_cpus[i] is the CPU set of lane i (empty: unpinned); config.lanes is taken from it.
  AffinityScheduler(SchedulerConfig config, std::vector<std::vector<int>> lane_cpus,
                    ExecuteFn execute, CompletionFn complete, PrefetchFn prefetch = {});
  ~AffinityScheduler();
  AffinityScheduler(const AffinityScheduler&) = delete;
  AffinityScheduler& operator=(const AffinityScheduler&) = delete;

  // Deadline is absolute on now()'s clock. A rejection is returned and also reported through
  // the completion callback, which stays the one answer per request; a queued request that
  // this one displaced is reported from here too, before submit returns.
  std::optional<RejectReason> submit(const Request& request);
  // drain: run what is queued first; otherwise queued requests are rejected with kShutdown.
  // Waits for the lanes to stop. Idempotent.
  void shutdown(bool drain);

  // Primes a key's latency model from a profile (e.g. warm-up runs) before live batches exist.
  void seed_latency(const std::string& key, std::size_t batch_size, Nanos latency);

  Nanos now() const noexcept { return clock_.now(); }
  MetricsSnapshot metrics() const;
  std::vector<PinningResult> pinning() const;  // after start-up, one per lane
  std::size_t lanes() const noexcept { return threads_.size(); }

 private:
  void run_lane(std::size_t lane, std::vector<int> cpus);
  void report(const std::vector<Outcome>& outcomes) noexcept;

  SteadyClock clock_;
  ExecuteFn execute_;
  CompletionFn complete_;
  PrefetchFn prefetch_;
  mutable std::mutex mutex_;
  std::mutex join_mutex_;  // shutdown() may be called from several threads at once
  std::condition_variable changed_;
  SchedulerCore core_;
  std::vector<PinningResult> pinning_;
  std::size_t lanes_started_ = 0;
  bool stopping_ = false;
  bool draining_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace latte::scheduling
