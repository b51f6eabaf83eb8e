#pragma once
// Counters the scheduler keeps while holding its lock, and the snapshot handed to callers.
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "latte/scheduling/clock.hpp"
#include "latte/scheduling/request.hpp"

namespace latte::scheduling {

struct LatencyPercentiles {
  std::uint64_t count = 0;
  double p50 = 0, p90 = 0, p99 = 0, p999 = 0;  // seconds, submit to completion
};

struct MetricsSnapshot {
  std::array<std::uint64_t, kPriorityLevels> queue_depth{};
  std::vector<std::uint64_t> batch_size_histogram;  // index = batch size
  std::uint64_t batches = 0;
  std::uint64_t batches_flushed_by_timeout = 0;
  std::uint64_t steals = 0;
  std::uint64_t affinity_hits = 0;
  std::uint64_t affinity_eligible = 0;  // batches whose key had run before
  std::uint64_t completed = 0;
  std::map<std::string, std::uint64_t> rejections;  // by reason name
  std::array<LatencyPercentiles, kPriorityLevels> latency{};
};

class Metrics {
 public:
  explicit Metrics(std::size_t max_batch_size);
  void on_batch(const Batch& batch, bool key_ran_before) noexcept;
  void on_steal() noexcept { ++steals_; }
  void on_completed(int priority, Nanos latency);
  void on_rejected(RejectReason reason) noexcept;
  MetricsSnapshot snapshot(const std::array<std::uint64_t, kPriorityLevels>& queue_depth) const;

 private:
  // Latencies kept per priority in a ring of the most recent ones: percentiles describe now.
  static constexpr std::size_t kLatencyRing = 1 << 16;
  struct LatencyRing {
    std::vector<Nanos> values;
    std::size_t next = 0;
    std::uint64_t total = 0;
  };
  std::vector<std::uint64_t> batch_sizes_;
  std::uint64_t batches_ = 0, timeouts_ = 0, steals_ = 0, hits_ = 0, eligible_ = 0, completed_ = 0;
  std::map<RejectReason, std::uint64_t> rejections_;
  std::array<LatencyRing, kPriorityLevels> latencies_;
};

}  // namespace latte::scheduling
