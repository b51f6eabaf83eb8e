// latte._native's scheduling part: the AffinityScheduler, whose lanes call back into Python,
// and the scheduler's limits and names (priority levels, reject reasons) that Python reads.
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.hpp"
#include "latte/error.hpp"
#include "latte/scheduling/affinity_scheduler.hpp"

namespace nb = nanobind;

namespace {
namespace sched = latte::scheduling;

// Seconds from Python to the scheduler's nanoseconds; whether the value is a sensible one is
// the scheduler's to say (SchedulerConfig, seed_latency), only NaN cannot be converted.
sched::Nanos to_nanos(double seconds, const char* name) {
  LATTE_EXPECTS(!std::isnan(seconds), std::string(name) + " must not be NaN");
  const double nanos = seconds * 1e9;
  if (nanos >= static_cast<double>(sched::kNoDeadline)) return sched::kNoDeadline;
  if (nanos <= -static_cast<double>(sched::kNoDeadline)) return -sched::kNoDeadline;
  return static_cast<sched::Nanos>(nanos);
}

// Python ints to the scheduler's unsigned counts: a negative one cannot be represented, so it
// is refused here; the count's own limits are the scheduler's to check.
std::uint64_t to_count(std::int64_t value, const char* name) {
  LATTE_EXPECTS(value >= 0, std::string(name) + " must not be negative, got " + std::to_string(value));
  return static_cast<std::uint64_t>(value);
}

std::string reason_text(const sched::Outcome& o) {
  std::string text = sched::reason_name(o.reason);
  if (!o.detail.empty()) text += ": " + o.detail;
  return text;
}

// Lanes are native threads; each takes the GIL only around a call into Python.
class PyAffinityScheduler {
 public:
  PyAffinityScheduler(nb::callable execute, nb::callable on_complete,
                      std::optional<nb::callable> prefetch,
                      std::vector<std::vector<int>> lane_cpus, std::int64_t max_batch_size,
                      std::int64_t max_batch_bytes, std::int64_t queue_capacity,
                      double max_window_s, double target_utilization,
                      std::int64_t placement_slack, std::int64_t steal_min_queued)
      : execute_(std::move(execute)), complete_(std::move(on_complete)),
        prefetch_(prefetch ? nb::object(*prefetch) : nb::none()) {
    sched::SchedulerConfig config;
    config.max_batch_size = to_count(max_batch_size, "max_batch_size");
    config.max_batch_bytes = to_count(max_batch_bytes, "max_batch_bytes");
    config.queue_capacity = to_count(queue_capacity, "queue_capacity");
    config.max_window = to_nanos(max_window_s, "max_window_s");
    config.target_utilization = target_utilization;
    config.placement_slack = to_count(placement_slack, "placement_slack");
    config.steal_min_queued = to_count(steal_min_queued, "steal_min_queued");
    sched::PrefetchFn prefetch_fn;
    if (!prefetch_.is_none()) prefetch_fn = [this](const sched::Batch& b) { call(prefetch_, b); };
    nb::gil_scoped_release release;  // lanes start without needing the GIL, but do not block them
    impl_ = std::make_unique<sched::AffinityScheduler>(
        config, std::move(lane_cpus), [this](const sched::Batch& b) { call(execute_, b); },
        [this](const std::vector<sched::Outcome>& outcomes) { report(outcomes); },
        std::move(prefetch_fn));
  }

  ~PyAffinityScheduler() {
    nb::gil_scoped_release release;
    impl_.reset();
  }

  std::optional<std::string> submit(std::uint64_t id, std::string key, int priority,
                                    std::optional<double> timeout_s, std::uint64_t size) {
    if (closed_) throw std::runtime_error("AffinityScheduler is closed; submit() needs an open one");
    const std::optional<sched::Nanos> timeout =
        timeout_s ? std::optional<sched::Nanos>(to_nanos(*timeout_s, "timeout_s")) : std::nullopt;
    sched::Request r;
    r.id = id;
    r.affinity_key = std::move(key);
    r.priority = priority;
    r.size = size;
    nb::gil_scoped_release release;
    const sched::Nanos now = impl_->now();
    if (timeout) {
      r.deadline = *timeout >= sched::kNoDeadline - now ? sched::kNoDeadline : now + *timeout;
    }
    std::optional<sched::RejectReason> refusal = impl_->submit(r);
    if (!refusal) return std::nullopt;
    return std::string(sched::reason_name(*refusal));
  }

  void close(bool drain) {
    {
      nb::gil_scoped_release release;
      impl_->shutdown(drain);
    }
    closed_ = true;
    // Drop the callables: they often refer back to this object, and nothing calls them now.
    execute_ = nb::none();
    complete_ = nb::none();
    prefetch_ = nb::none();
  }

  void seed_latency(const std::string& key, std::size_t batch_size, double latency_s) {
    const sched::Nanos latency = to_nanos(latency_s, "latency_s");
    nb::gil_scoped_release release;
    impl_->seed_latency(key, batch_size, latency);
  }

  bool closed() const { return closed_; }
  double now() const { return static_cast<double>(impl_->now()) * 1e-9; }
  std::size_t lanes() const { return impl_->lanes(); }

  nb::list pinning() const {
    nb::list out;
    for (const sched::PinningResult& p : impl_->pinning()) {
      out.append(nb::make_tuple(p.pinned, p.message));
    }
    return out;
  }

  nb::dict metrics() const {
    sched::MetricsSnapshot m;
    {
      nb::gil_scoped_release release;
      m = impl_->metrics();
    }
    nb::dict d;
    nb::dict depth, histogram, rejections, latency;
    for (int p = 0; p < sched::kPriorityLevels; ++p) depth[nb::int_(p)] = m.queue_depth[p];
    for (std::size_t n = 1; n < m.batch_size_histogram.size(); ++n) {
      if (m.batch_size_histogram[n] > 0) histogram[nb::int_(n)] = m.batch_size_histogram[n];
    }
    for (const auto& [reason, count] : m.rejections) rejections[nb::str(reason.c_str())] = count;
    for (int p = 0; p < sched::kPriorityLevels; ++p) {
      const sched::LatencyPercentiles& l = m.latency[p];
      if (l.count == 0) continue;
      nb::dict one;
      one["count"] = l.count;
      one["p50"] = l.p50;
      one["p90"] = l.p90;
      one["p99"] = l.p99;
      one["p999"] = l.p999;
      latency[nb::int_(p)] = one;
    }
    d["queue_depth"] = depth;
    d["batch_size_histogram"] = histogram;
    d["batches"] = m.batches;
    d["batches_flushed_by_timeout"] = m.batches_flushed_by_timeout;
    d["timeout_flush_share"] =
        m.batches ? static_cast<double>(m.batches_flushed_by_timeout) / m.batches : 0.0;
    d["steals"] = m.steals;
    d["affinity_hits"] = m.affinity_hits;
    d["affinity_hit_rate"] =
        m.affinity_eligible ? static_cast<double>(m.affinity_hits) / m.affinity_eligible : 0.0;
    d["completed"] = m.completed;
    d["rejections"] = rejections;
    d["latency_s"] = latency;
    return d;
  }

 private:
  // Runs on a lane thread without the GIL.
  void call(const nb::object& fn, const sched::Batch& batch) {
    nb::gil_scoped_acquire gil;
    nb::list ids;
    for (const sched::QueuedRequest& q : batch.requests) ids.append(q.request.id);
    try {
      fn(batch.affinity_key, ids, batch.lane);
    } catch (nb::python_error& e) {
      // The model's exception becomes the requests' error reason.
      std::string message = nb::borrow<nb::str>(nb::handle(e.type()).attr("__name__")).c_str();
      message += ": ";
      message += nb::str(e.value()).c_str();
      throw std::runtime_error(message);
    }
  }

  void report(const std::vector<sched::Outcome>& outcomes) {
    nb::gil_scoped_acquire gil;
    if (complete_.is_none()) return;
    for (const sched::Outcome& o : outcomes) {
      try {
        if (o.ok) {
          complete_(o.id, nb::none());
        } else {
          complete_(o.id, reason_text(o));
        }
      } catch (nb::python_error& e) {
        // One failing delivery must not keep the others of the batch from being reported.
        e.discard_as_unraisable("latte.scheduling on_complete callback");
      }
    }
  }

  nb::object execute_, complete_, prefetch_;
  std::unique_ptr<sched::AffinityScheduler> impl_;
  bool closed_ = false;
};

}  // namespace

void bind_scheduling(nb::module_& m) {
  nb::class_<PyAffinityScheduler>(m, "AffinityScheduler", nb::is_weak_referenceable(),
                                  "Native locality-aware scheduler; use latte.scheduling.")
      .def(nb::init<nb::callable, nb::callable, std::optional<nb::callable>, std::vector<std::vector<int>>,
                    std::int64_t, std::int64_t, std::int64_t, double, double, std::int64_t,
                    std::int64_t>(),
           nb::arg("execute"), nb::arg("on_complete"), nb::arg("prefetch").none(),
           nb::arg("lane_cpus"), nb::arg("max_batch_size"), nb::arg("max_batch_bytes"),
           nb::arg("queue_capacity"), nb::arg("max_window_s"), nb::arg("target_utilization"),
           nb::arg("placement_slack"), nb::arg("steal_min_queued"))
      .def("submit", &PyAffinityScheduler::submit, nb::arg("request_id"), nb::arg("key"),
           nb::kw_only(), nb::arg("priority") = 0, nb::arg("timeout_s").none() = nb::none(),
           nb::arg("size") = 1,
           "Queue a request; returns None when admitted, else the rejection reason (which "
           "on_complete also receives, as the one answer for the request).")
      .def("close", &PyAffinityScheduler::close, nb::arg("drain") = true,
           "Stop the lanes; drain=True runs what is queued first, else it is rejected.")
      .def("seed_latency", &PyAffinityScheduler::seed_latency, nb::arg("key"),
           nb::arg("batch_size"), nb::arg("latency_s"),
           "Prime a key's latency model with a measured batch (e.g. from warm-up runs), so "
           "the adaptive window can decide before the key's first live batches.")
      .def_prop_ro("closed", &PyAffinityScheduler::closed)
      .def_prop_ro("lanes", &PyAffinityScheduler::lanes)
      .def("now", &PyAffinityScheduler::now, "The scheduler's clock, in seconds.")
      .def("pinning", &PyAffinityScheduler::pinning,
           "Per lane: (pinned, reason it is not) after start-up.")
      .def("metrics", &PyAffinityScheduler::metrics, "Counters and latency percentiles.");
  // The reasons' names are the strings submit() and on_complete report, so Python code can
  // name a reason (RejectReason.queue_full.name) without writing the string a second time.
  nb::enum_<sched::RejectReason> reason_enum(m, "RejectReason",
                                             "Why the scheduler answered a request with an error.");
  nb::list reasons;
  for (sched::RejectReason r : sched::kRejectReasons) {
    reason_enum.value(sched::reason_name(r), r);
    reasons.append(sched::reason_name(r));
  }
  m.attr("REJECT_REASONS") = nb::tuple(reasons);
  m.attr("PRIORITY_LEVELS") = sched::kPriorityLevels;
}
