#pragma once
// Time source of the scheduler. Tests step a VirtualClock so that every decision is reproducible.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>

namespace latte::scheduling {

using Nanos = std::int64_t;
constexpr Nanos kNoDeadline = std::numeric_limits<Nanos>::max();

class Clock {
 public:
  virtual ~Clock() = default;
  virtual Nanos now() const noexcept = 0;
};

class SteadyClock final : public Clock {
 public:
  Nanos now() const noexcept override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};

class VirtualClock final : public Clock {
 public:
  explicit VirtualClock(Nanos start = 0) : now_(start) {}
  Nanos now() const noexcept override { return now_.load(std::memory_order_acquire); }
  void advance(Nanos by) noexcept { now_.fetch_add(by, std::memory_order_acq_rel); }
  void set(Nanos to) noexcept { now_.store(to, std::memory_order_release); }

 private:
  std::atomic<Nanos> now_;
};

}  // namespace latte::scheduling
