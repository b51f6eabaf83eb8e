#pragma once
// Online fit of batch latency as a*n + b over the most recent batches of one affinity key.
#include <array>
#include <cstddef>

#include "latte/scheduling/clock.hpp"

namespace latte::scheduling {

class LatencyModel {
 public:
  static constexpr std::size_t kWindow = 32;

  void record(std::size_t batch_size, Nanos latency) noexcept;
  // Two samples are needed before the fit says anything.
  bool ready() const noexcept { return count_ >= 2; }
  double per_item() const noexcept { return a_; }   // a, in nanoseconds per request
  double fixed() const noexcept { return b_; }      // b, in nanoseconds per batch
  Nanos predict(std::size_t batch_size) const noexcept;
  // The fastest of the recent batches: a floor no request of this key finishes under, robust
  // to the outliers (a preempted lane) that tilt the fitted line.
  Nanos fastest() const noexcept;

 private:
  void refit() noexcept;
  std::array<double, kWindow> sizes_{};
  std::array<double, kWindow> latencies_{};
  std::size_t count_ = 0;
  std::size_t next_ = 0;
  double a_ = 0.0;
  double b_ = 0.0;
};

// Arrival rate of one key: smoothed inter-arrival gap, decayed by the silence since the last one
// so a key that went quiet stops looking busy.
class ArrivalRate {
 public:
  void record(Nanos at) noexcept;
  double per_nanosecond(Nanos now) const noexcept;

 private:
  Nanos last_ = -1;
  double smoothed_gap_ = 0.0;  // 0 until two arrivals were seen
};

}  // namespace latte::scheduling
