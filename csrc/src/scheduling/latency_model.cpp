#include "latte/scheduling/latency_model.hpp"

#include <algorithm>
#include <cmath>

namespace latte::scheduling {

void LatencyModel::record(std::size_t batch_size, Nanos latency) noexcept {
  sizes_[next_] = static_cast<double>(batch_size);
  latencies_[next_] = static_cast<double>(latency);
  next_ = (next_ + 1) % kWindow;
  count_ = std::min(count_ + 1, kWindow);
  refit();
}

void LatencyModel::refit() noexcept {
  const double n = static_cast<double>(count_);
  double mean_size = 0, mean_latency = 0;
  for (std::size_t i = 0; i < count_; ++i) {
    mean_size += sizes_[i];
    mean_latency += latencies_[i];
  }
  mean_size /= n;
  mean_latency /= n;
  double covariance = 0, variance = 0;
  for (std::size_t i = 0; i < count_; ++i) {
    covariance += (sizes_[i] - mean_size) * (latencies_[i] - mean_latency);
    variance += (sizes_[i] - mean_size) * (sizes_[i] - mean_size);
  }
  if (variance <= 0.0) {
    // One batch size only: the split into fixed and per-item cost is unknown, so assume no
    // fixed cost; that never claims a gain from waiting that was not observed.
    a_ = mean_latency / mean_size;
    b_ = 0.0;
    return;
  }
  a_ = covariance / variance;
  b_ = mean_latency - a_ * mean_size;
  // Noise can tilt the line; latency is never negative per item or per batch.
  if (a_ < 0.0) {
    a_ = 0.0;
    b_ = mean_latency;
  } else if (b_ < 0.0) {
    b_ = 0.0;
    a_ = mean_latency / mean_size;
  }
}

Nanos LatencyModel::predict(std::size_t batch_size) const noexcept {
  return static_cast<Nanos>(std::llround(a_ * static_cast<double>(batch_size) + b_));
}

Nanos LatencyModel::fastest() const noexcept {
  if (count_ == 0) return 0;
  double least = latencies_[0];
  for (std::size_t i = 1; i < count_; ++i) least = std::min(least, latencies_[i]);
  return static_cast<Nanos>(least);
}

void ArrivalRate::record(Nanos at) noexcept {
  if (last_ >= 0) {
    const double gap = static_cast<double>(std::max<Nanos>(at - last_, 1));
    // Smoothing over ~8 arrivals follows load changes within a few batches; a gap far beyond
    // anything a Poisson stream of the smoothed rate produces is a pause, and restarts it.
    const bool pause = gap > 8.0 * smoothed_gap_;
    smoothed_gap_ = smoothed_gap_ == 0.0 || pause ? gap : 0.875 * smoothed_gap_ + 0.125 * gap;
  }
  last_ = at;
}

double ArrivalRate::per_nanosecond(Nanos now) const noexcept {
  if (smoothed_gap_ == 0.0) return 0.0;
  const double silence = static_cast<double>(now - last_);
  return 1.0 / std::max(smoothed_gap_, silence);
}

}  // namespace latte::scheduling
