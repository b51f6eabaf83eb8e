#include "latte/scheduling/metrics.hpp"

#include <algorithm>

namespace latte::scheduling {

Metrics::Metrics(std::size_t max_batch_size) : batch_sizes_(max_batch_size + 1, 0) {}

void Metrics::on_batch(const Batch& batch, bool key_ran_before) noexcept {
  ++batches_;
  ++batch_sizes_[std::min(batch.requests.size(), batch_sizes_.size() - 1)];
  if (batch.flushed_by_timeout) ++timeouts_;
  if (key_ran_before) {
    ++eligible_;
    if (batch.affinity_hit) ++hits_;
  }
}

void Metrics::on_completed(int priority, Nanos latency) {
  ++completed_;
  LatencyRing& ring = latencies_[static_cast<std::size_t>(priority)];
  if (ring.values.size() < kLatencyRing) {
    ring.values.push_back(latency);
  } else {
    ring.values[ring.next] = latency;
  }
  ring.next = (ring.next + 1) % kLatencyRing;
  ++ring.total;
}

void Metrics::on_rejected(RejectReason reason) noexcept { ++rejections_[reason]; }

static double percentile(std::vector<Nanos>& sorted, double q) {
  const std::size_t index =
      std::min(sorted.size() - 1, static_cast<std::size_t>(q * static_cast<double>(sorted.size())));
  return static_cast<double>(sorted[index]) * 1e-9;
}

MetricsSnapshot Metrics::snapshot(
    const std::array<std::uint64_t, kPriorityLevels>& queue_depth) const {
  MetricsSnapshot s;
  s.queue_depth = queue_depth;
  s.batch_size_histogram = batch_sizes_;
  s.batches = batches_;
  s.batches_flushed_by_timeout = timeouts_;
  s.steals = steals_;
  s.affinity_hits = hits_;
  s.affinity_eligible = eligible_;
  s.completed = completed_;
  for (const auto& [reason, count] : rejections_) s.rejections[reason_name(reason)] = count;
  for (std::size_t p = 0; p < latencies_.size(); ++p) {
    std::vector<Nanos> values = latencies_[p].values;
    if (values.empty()) continue;
    std::sort(values.begin(), values.end());
    LatencyPercentiles& out = s.latency[p];
    out.count = latencies_[p].total;
    out.p50 = percentile(values, 0.50);
    out.p90 = percentile(values, 0.90);
    out.p99 = percentile(values, 0.99);
    out.p999 = percentile(values, 0.999);
  }
  return s;
}

}  // namespace latte::scheduling
