#include "latte/scheduling/affinity_scheduler.hpp"

#include <cstdio>
#include <exception>

#include "latte/error.hpp"

namespace latte::scheduling {
namespace {

SchedulerConfig with_lanes(SchedulerConfig config, std::size_t lanes) {
  LATTE_EXPECTS(lanes >= 1, "lane_cpus must name at least one lane");
  config.lanes = lanes;
  return config;
}

}  // namespace

AffinityScheduler::AffinityScheduler(SchedulerConfig config,
                                     std::vector<std::vector<int>> lane_cpus, ExecuteFn execute,
                                     CompletionFn complete, PrefetchFn prefetch)
    : execute_(std::move(execute)),
      complete_(std::move(complete)),
      prefetch_(std::move(prefetch)),
      core_(with_lanes(config, lane_cpus.size())),
      pinning_(lane_cpus.size()) {
  LATTE_EXPECTS(static_cast<bool>(execute_), "execute callback is required");
  LATTE_EXPECTS(static_cast<bool>(complete_), "completion callback is required");
  threads_.reserve(lane_cpus.size());
  for (std::size_t lane = 0; lane < lane_cpus.size(); ++lane) {
    threads_.emplace_back(&AffinityScheduler::run_lane, this, lane, lane_cpus[lane]);
  }
  // pinning() is meaningful as soon as the constructor returns.
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return lanes_started_ == threads_.size(); });
}

AffinityScheduler::~AffinityScheduler() { shutdown(false); }

std::optional<RejectReason> AffinityScheduler::submit(const Request& request) {
  std::optional<RejectReason> refusal;
  std::vector<Outcome> answered;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    refusal = stopping_ ? std::optional<RejectReason>(RejectReason::kShutdown)
                        : core_.submit(request, clock_.now());
    // A request this one displaced is answered now: the lanes may all be busy for a while
    // before one looks at the queue again, and its client should hear at once.
    answered = core_.take_rejections();
  }
  if (refusal) answered.push_back(Outcome{request.id, false, *refusal, {}});
  if (!answered.empty()) report(answered);
  if (!refusal) changed_.notify_all();
  return refusal;
}

void AffinityScheduler::seed_latency(const std::string& key, std::size_t batch_size, Nanos latency) {
  std::lock_guard<std::mutex> lock(mutex_);
  core_.seed_latency(key, batch_size, latency);
}

void AffinityScheduler::shutdown(bool drain) {
  const auto self = std::this_thread::get_id();
  for (const std::thread& t : threads_) {
    LATTE_EXPECTS(t.get_id() != self,
                        "shutdown() called from a lane thread (inside execute or a callback)");
  }
  std::vector<Outcome> rejected;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stopping_) {
      stopping_ = true;
      draining_ = drain;
      core_.set_draining(true);
      if (!drain) {
        core_.reject_all(RejectReason::kShutdown);
        rejected = core_.take_rejections();
      }
    }
  }
  changed_.notify_all();
  if (!rejected.empty()) report(rejected);
  std::lock_guard<std::mutex> join_lock(join_mutex_);
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

MetricsSnapshot AffinityScheduler::metrics() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return core_.metrics();
}

std::vector<PinningResult> AffinityScheduler::pinning() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pinning_;
}

void AffinityScheduler::report(const std::vector<Outcome>& outcomes) noexcept {
  try {
    complete_(outcomes);
  } catch (const std::exception& e) {
    // The callback owns delivery; a failure there must not take a lane down with it.
    std::fprintf(stderr, "latte.scheduling: completion callback raised: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "latte.scheduling: completion callback raised\n");
  }
}

void AffinityScheduler::run_lane(std::size_t lane, std::vector<int> cpus) {
  const PinningResult pin = pin_current_thread(cpus);
  if (!pin.pinned && !cpus.empty()) {
    std::fprintf(stderr, "latte.scheduling: warning: lane %zu runs unpinned: %s\n", lane,
                 pin.message.c_str());
  }
  std::unique_lock<std::mutex> lock(mutex_);
  pinning_[lane] = pin;
  ++lanes_started_;
  changed_.notify_all();
  while (!(stopping_ && (!draining_ || core_.queued() == 0))) {
    Decision decision = core_.next_batch(lane, clock_.now());
    std::vector<Outcome> expired = core_.take_rejections();
    if (!expired.empty()) {
      lock.unlock();
      report(expired);
      // Expiry may have emptied the queue that draining lanes are waiting to see empty.
      changed_.notify_all();
      lock.lock();
    }
    if (decision.kind == Decision::Kind::kRun) {
      std::optional<Batch> next;
      if (prefetch_) next = core_.peek_next(lane);
      // This lane is busy now: what it left queued may be worth stealing for an idle lane.
      const bool left_work = core_.queued_on(lane) > 0;
      lock.unlock();
      if (left_work) changed_.notify_all();
      if (next) {
        try {
          prefetch_(*next);
        } catch (...) {
          // Staging is an optimisation; the batch itself still runs.
        }
      }
      std::vector<Outcome> outcomes;
      outcomes.reserve(decision.batch.requests.size());
      for (const QueuedRequest& q : decision.batch.requests) outcomes.push_back(Outcome{q.request.id, true, {}, {}});
      try {
        execute_(decision.batch);
      } catch (const std::exception& e) {
        for (Outcome& o : outcomes) {
          o.ok = false;
          o.reason = RejectReason::kExecuteFailed;
          o.detail = e.what();
        }
      } catch (...) {
        for (Outcome& o : outcomes) {
          o.ok = false;
          o.reason = RejectReason::kExecuteFailed;
          o.detail = "unknown exception";
        }
      }
      lock.lock();
      core_.complete(decision.batch, outcomes, clock_.now());
      lock.unlock();
      report(outcomes);
      // A lane became free: drains may finish and idle lanes may find something to steal.
      changed_.notify_all();
      lock.lock();
      continue;
    }
    // The lock was dropped to report: re-evaluate before sleeping on stale state.
    if (!expired.empty()) continue;
    if (decision.kind == Decision::Kind::kWait) {
      changed_.wait_until(lock, std::chrono::steady_clock::time_point(
                                    std::chrono::nanoseconds(decision.wake_at)));
    } else {
      changed_.wait(lock);
    }
  }
  lock.unlock();
  // Whatever let this lane stop may let the others stop too.
  changed_.notify_all();
}

}  // namespace latte::scheduling
