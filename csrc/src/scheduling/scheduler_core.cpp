#include "latte/scheduling/scheduler_core.hpp"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "latte/error.hpp"

// Invariants re-checked after every mutation in builds with LATTE_DEBUG_CHECKS only.
#ifdef LATTE_DEBUG_CHECKS
#define LATTE_SCHED_INVARIANT(expr) check_invariants_(expr)
#else
#define LATTE_SCHED_INVARIANT(expr) ((void)0)
#endif

namespace latte::scheduling {

bool SchedulerCore::MoreUrgent::operator()(const QueuedRequest& x,
                                           const QueuedRequest& y) const noexcept {
  return std::make_tuple(-x.request.priority, x.request.deadline, x.sequence) <
         std::make_tuple(-y.request.priority, y.request.deadline, y.sequence);
}

SchedulerCore::SchedulerCore(SchedulerConfig config)
    : config_(config), lanes_(config.lanes), metrics_(config.max_batch_size) {
  LATTE_EXPECTS(config.lanes >= 1, "lanes must be at least 1");
  LATTE_EXPECTS(config.max_batch_size >= 1, "max_batch_size must be at least 1, got " + std::to_string(config.max_batch_size));
  LATTE_EXPECTS(config.max_batch_bytes >= 1, "max_batch_bytes must be at least 1, got " + std::to_string(config.max_batch_bytes));
  LATTE_EXPECTS(config.queue_capacity >= 1, "queue_capacity must be at least 1, got " + std::to_string(config.queue_capacity));
  LATTE_EXPECTS(config.max_window >= 0 && config.max_window <= kMaxWindowLimit,
                "max_window must be in [0, " + std::to_string(kMaxWindowLimit / 1'000'000'000) +
                    "] seconds, got " + std::to_string(config.max_window * 1e-9) + " s");
  LATTE_EXPECTS(config.target_utilization > 0.0 && config.target_utilization <= 1.0,
                "target_utilization must be in (0, 1], got " + std::to_string(config.target_utilization));
}

std::optional<RejectReason> SchedulerCore::submit(const Request& request, Nanos now) {
  LATTE_EXPECTS(!request.affinity_key.empty(), "affinity_key must be a non-empty string");
  LATTE_EXPECTS(request.priority >= 0 && request.priority < kPriorityLevels,
                "priority must be in [0, " + std::to_string(kPriorityLevels - 1) +
                          "], got " + std::to_string(request.priority));
  LATTE_EXPECTS(open_ids_.count(request.id) == 0,
                "request id " + std::to_string(request.id) +
                          " is already queued or running; ids must be unique among open requests");
  std::optional<RejectReason> refusal;
  if (request.size > config_.max_batch_bytes) {
    refusal = RejectReason::kTooLarge;
  } else if (request.deadline <= now) {
    refusal = RejectReason::kDeadlinePassed;
  } else if (queued_ >= config_.queue_capacity && !displace_less_urgent_than(request)) {
    refusal = RejectReason::kQueueFull;
  }
  if (refusal) {
    metrics_.on_rejected(*refusal);
    return refusal;
  }
  const std::size_t lane_index = place(request.affinity_key, request.priority);
  Lane& lane = lanes_[lane_index];
  Group& group = lane.groups[request.affinity_key];
  group.requests.insert(QueuedRequest{request, now, sequence_++});
  group.bytes += request.size;
  group_lane_[request.affinity_key] = lane_index;
  ++lane.queued;
  ++queued_;
  ++depth_[static_cast<std::size_t>(request.priority)];
  open_ids_.insert(request.id);
  keys_[request.affinity_key].arrivals.record(now);
  LATTE_SCHED_INVARIANT(true);
  return std::nullopt;
}

std::size_t SchedulerCore::place(const std::string& key, int priority) const {
  if (auto it = group_lane_.find(key); it != group_lane_.end()) return it->second;
  // Load as this request sees it: only work at its priority or above runs before it.
  auto load = [&](std::size_t l) {
    std::size_t ahead = lanes_[l].busy ? 1 : 0;
    for (const auto& [k, group] : lanes_[l].groups) {
      for (const QueuedRequest& q : group.requests) {
        if (q.request.priority < priority) break;  // ordered most urgent first
        ++ahead;
      }
    }
    return ahead;
  };
  std::size_t least = 0;
  for (std::size_t l = 1; l < lanes_.size(); ++l) {
    if (load(l) < load(least)) least = l;
  }
  if (auto it = keys_.find(key); it != keys_.end() && it->second.last_lane) {
    const std::size_t home = *it->second.last_lane;
    // Warm state is worth a short queue, not an unbounded one.
    if (load(home) <= load(least) + config_.placement_slack) return home;
  }
  return least;
}

bool SchedulerCore::displace_less_urgent_than(const Request& request) {
  // The least urgent queued request is the last one of some group.
  std::size_t victim_lane = 0;
  const std::string* victim_key = nullptr;
  const QueuedRequest* victim = nullptr;
  MoreUrgent more_urgent;
  for (std::size_t l = 0; l < lanes_.size(); ++l) {
    for (auto& [key, group] : lanes_[l].groups) {
      const QueuedRequest& last = *group.requests.rbegin();
      if (victim == nullptr || more_urgent(*victim, last)) {
        victim = &last;
        victim_key = &key;
        victim_lane = l;
      }
    }
  }
  if (victim == nullptr || victim->request.priority >= request.priority) return false;
  Lane& lane = lanes_[victim_lane];
  const std::string key = *victim_key;
  Group& group = lane.groups.at(key);
  remove_request(victim_lane, group, std::prev(group.requests.end()), RejectReason::kDisplaced);
  if (group.requests.empty()) {
    lane.groups.erase(key);
    group_lane_.erase(key);
  }
  return true;
}

void SchedulerCore::remove_request(std::size_t lane_index, Group& group,
                                   std::set<QueuedRequest, MoreUrgent>::iterator it,
                                   RejectReason reason) {
  const Request& request = it->request;
  rejections_.push_back(Outcome{request.id, false, reason, {}});
  metrics_.on_rejected(reason);
  open_ids_.erase(request.id);
  --depth_[static_cast<std::size_t>(request.priority)];
  --queued_;
  --lanes_[lane_index].queued;
  group.bytes -= request.size;
  group.requests.erase(it);
}

void SchedulerCore::expire(Nanos now) {
  for (std::size_t l = 0; l < lanes_.size(); ++l) {
    Lane& lane = lanes_[l];
    for (auto g = lane.groups.begin(); g != lane.groups.end();) {
      Group& group = g->second;
      // A request that cannot finish by its deadline even in the fastest batch seen lately
      // would only take lane time from requests that still can.
      const auto key_state = keys_.find(g->first);
      const Nanos shortest =
          key_state != keys_.end() && key_state->second.latency.ready()
              ? key_state->second.latency.fastest()
              : 0;
      for (auto it = group.requests.begin(); it != group.requests.end();) {
        auto next = std::next(it);
        if (it->request.deadline - shortest <= now) {
          remove_request(l, group, it, RejectReason::kDeadlineExpired);
        }
        it = next;
      }
      if (group.requests.empty()) {
        group_lane_.erase(g->first);
        g = lane.groups.erase(g);
      } else {
        ++g;
      }
    }
  }
}

void SchedulerCore::reject_all(RejectReason reason) {
  for (std::size_t l = 0; l < lanes_.size(); ++l) {
    Lane& lane = lanes_[l];
    for (auto& entry : lane.groups) {
      Group& group = entry.second;
      while (!group.requests.empty()) {
        remove_request(l, group, group.requests.begin(), reason);
      }
    }
    lane.groups.clear();
  }
  group_lane_.clear();
  LATTE_SCHED_INVARIANT(true);
}

std::vector<Outcome> SchedulerCore::take_rejections() {
  std::vector<Outcome> out;
  out.swap(rejections_);
  return out;
}

std::map<std::string, SchedulerCore::Group>::iterator SchedulerCore::most_urgent_group(
    Lane& lane) {
  MoreUrgent more_urgent;
  auto best = lane.groups.begin();
  for (auto g = lane.groups.begin(); g != lane.groups.end(); ++g) {
    if (more_urgent(*g->second.requests.begin(), *best->second.requests.begin())) best = g;
  }
  return best;
}

bool SchedulerCore::steal_into(std::size_t thief) {
  // Victim: the lane with the most queued requests that cannot start them all right now.
  std::optional<std::size_t> victim;
  for (std::size_t l = 0; l < lanes_.size(); ++l) {
    const Lane& lane = lanes_[l];
    if (l == thief || lane.groups.empty() || lane.queued < config_.steal_min_queued) continue;
    if (!lane.busy && lane.groups.size() < 2) continue;
    if (!victim || lane.queued > lanes_[*victim].queued) victim = l;
  }
  if (!victim) return false;
  Lane& from = lanes_[*victim];
  // An idle victim runs its most urgent group itself next; leave that one to it.
  auto keep = from.busy ? from.groups.end() : most_urgent_group(from);
  auto recent = [&](const std::string& key) {
    return std::find(from.recent_keys.begin(), from.recent_keys.end(), key) !=
           from.recent_keys.end();
  };
  MoreUrgent more_urgent;
  auto chosen = from.groups.end();
  for (auto g = from.groups.begin(); g != from.groups.end(); ++g) {
    if (g == keep) continue;
    if (chosen == from.groups.end()) {
      chosen = g;
      continue;
    }
    // Higher priority first; within a priority, keys the victim has not run recently (it has
    // nothing warm for them), then the earliest deadline.
    const QueuedRequest& g_head = *g->second.requests.begin();
    const QueuedRequest& chosen_head = *chosen->second.requests.begin();
    const bool g_recent = recent(g->first), chosen_recent = recent(chosen->first);
    if (g_head.request.priority != chosen_head.request.priority) {
      if (g_head.request.priority > chosen_head.request.priority) chosen = g;
    } else if (g_recent != chosen_recent) {
      if (!g_recent) chosen = g;
    } else if (more_urgent(g_head, chosen_head)) {
      chosen = g;
    }
  }
  if (chosen == from.groups.end()) return false;
  const std::size_t moved = chosen->second.requests.size();
  auto node = from.groups.extract(chosen);
  node.mapped().stolen = true;
  node.mapped().hold_until = -1;
  group_lane_[node.key()] = thief;
  from.queued -= moved;
  lanes_[thief].queued += moved;
  lanes_[thief].groups.insert(std::move(node));
  metrics_.on_steal();
  return true;
}

std::size_t SchedulerCore::target_batch_size(const std::string& key, Nanos now) const {
  auto it = keys_.find(key);
  if (it == keys_.end() || !it->second.latency.ready()) return 1;
  const double rate = it->second.arrivals.per_nanosecond(now);
  const double a = it->second.latency.per_item();
  const double b = it->second.latency.fixed();
  if (rate <= 0.0 || b <= 0.0) return 1;
  // Batches of n keep the lane at utilisation rate*(a + b/n); solve for the target utilisation.
  const double headroom = config_.target_utilization - rate * a;
  if (headroom <= 0.0) return config_.max_batch_size;
  const double n = std::ceil(rate * b / headroom);
  return static_cast<std::size_t>(std::clamp(n, 1.0, static_cast<double>(config_.max_batch_size)));
}

bool SchedulerCore::should_wait(const std::string& key, Group& group, const Lane& lane,
                                Nanos now, Nanos* wake_at, bool* window_expired) {
  *window_expired = false;
  if (draining_ || group.stolen || config_.max_window == 0) return false;
  const std::size_t n = group.requests.size();
  if (n >= config_.max_batch_size || group.bytes >= config_.max_batch_bytes) return false;
  // Other work is queued on this lane: holding this group back would idle the lane.
  if (lane.groups.size() > 1) return false;
  const std::size_t target = target_batch_size(key, now);
  if (n >= target) return false;
  const bool was_held = group.hold_until >= 0;
  if (!was_held) {
    const double rate = keys_.at(key).arrivals.per_nanosecond(now);
    const double expected = static_cast<double>(target - n) / rate;
    group.hold_until = now + static_cast<Nanos>(std::min<double>(
                                 expected, static_cast<double>(config_.max_window)));
  }
  // Every queued deadline must still hold if the batch starts at the end of the wait.
  Nanos earliest_deadline = kNoDeadline;
  for (const QueuedRequest& q : group.requests) {
    earliest_deadline = std::min(earliest_deadline, q.request.deadline);
  }
  Nanos wake = group.hold_until;
  if (earliest_deadline != kNoDeadline) {
    wake = std::min(wake, earliest_deadline - keys_.at(key).latency.predict(target));
  }
  if (now >= wake) {
    *window_expired = was_held;
    return false;
  }
  *wake_at = wake;
  return true;
}

Batch SchedulerCore::take_batch(std::size_t lane_index,
                                std::map<std::string, Group>::iterator g, Nanos now,
                                bool window_expired) {
  Lane& lane = lanes_[lane_index];
  Group& group = g->second;
  Batch batch;
  batch.affinity_key = g->first;
  batch.lane = lane_index;
  batch.started = now;
  batch.stolen = group.stolen;
  batch.flushed_by_timeout = window_expired;
  while (!group.requests.empty() && batch.requests.size() < config_.max_batch_size) {
    const std::uint64_t size = group.requests.begin()->request.size;
    if (!batch.requests.empty() && batch.bytes + size > config_.max_batch_bytes) break;
    auto node = group.requests.extract(group.requests.begin());
    batch.bytes += size;
    --depth_[static_cast<std::size_t>(node.value().request.priority)];
    batch.requests.push_back(std::move(node.value()));
  }
  const std::size_t taken = batch.requests.size();
  queued_ -= taken;
  lane.queued -= taken;
  group.bytes -= batch.bytes;
  if (group.requests.empty()) {
    group_lane_.erase(g->first);
    lane.groups.erase(g);
  } else {
    group.hold_until = -1;
    group.stolen = false;
  }
  KeyState& key_state = keys_[batch.affinity_key];
  const bool ran_before = key_state.last_lane.has_value();
  batch.affinity_hit = ran_before && *key_state.last_lane == lane_index;
  key_state.last_lane = lane_index;
  touch(lane, batch.affinity_key);
  lane.busy = true;
  metrics_.on_batch(batch, ran_before);
  LATTE_SCHED_INVARIANT(true);
  return batch;
}

void SchedulerCore::touch(Lane& lane, const std::string& key) {
  auto it = std::find(lane.recent_keys.begin(), lane.recent_keys.end(), key);
  if (it != lane.recent_keys.end()) lane.recent_keys.erase(it);
  lane.recent_keys.push_front(key);
  while (lane.recent_keys.size() > config_.recent_keys_per_lane) lane.recent_keys.pop_back();
}

Decision SchedulerCore::next_batch(std::size_t lane_index, Nanos now) {
  LATTE_EXPECTS(lane_index < lanes_.size(),
                "lane " + std::to_string(lane_index) + " does not exist (have " +
                          std::to_string(lanes_.size()) + ")");
  LATTE_EXPECTS(!lanes_[lane_index].busy,
                "lane " + std::to_string(lane_index) +
                          " is still running a batch; call complete() first");
  expire(now);
  Lane& lane = lanes_[lane_index];
  Decision decision;
  if (lane.groups.empty() && !steal_into(lane_index)) return decision;
  auto group = most_urgent_group(lane);
  Nanos wake_at = 0;
  bool window_expired = false;
  if (should_wait(group->first, group->second, lane, now, &wake_at, &window_expired)) {
    decision.kind = Decision::Kind::kWait;
    decision.wake_at = wake_at;
    return decision;
  }
  decision.kind = Decision::Kind::kRun;
  decision.batch = take_batch(lane_index, group, now, window_expired);
  return decision;
}

std::optional<Batch> SchedulerCore::peek_next(std::size_t lane_index) const {
  LATTE_EXPECTS(lane_index < lanes_.size(), "lane does not exist");
  const Lane& lane = lanes_[lane_index];
  if (lane.groups.empty()) return std::nullopt;
  MoreUrgent more_urgent;
  auto best = lane.groups.begin();
  for (auto g = lane.groups.begin(); g != lane.groups.end(); ++g) {
    if (more_urgent(*g->second.requests.begin(), *best->second.requests.begin())) best = g;
  }
  Batch batch;
  batch.affinity_key = best->first;
  batch.lane = lane_index;
  for (const QueuedRequest& q : best->second.requests) {
    if (batch.requests.size() >= config_.max_batch_size) break;
    if (!batch.requests.empty() && batch.bytes + q.request.size > config_.max_batch_bytes) break;
    batch.bytes += q.request.size;
    batch.requests.push_back(q);
  }
  return batch;
}

void SchedulerCore::complete(const Batch& batch, const std::vector<Outcome>& outcomes, Nanos now) {
  LATTE_EXPECTS(batch.lane < lanes_.size() && lanes_[batch.lane].busy,
                "complete() for a lane that is not running a batch");
  LATTE_EXPECTS(outcomes.size() == batch.requests.size(),
                "complete() needs one outcome per request of the batch");
  lanes_[batch.lane].busy = false;
  bool all_ok = true;
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    const QueuedRequest& q = batch.requests[i];
    open_ids_.erase(q.request.id);
    if (outcomes[i].ok) {
      metrics_.on_completed(q.request.priority, now - q.submitted);
    } else {
      all_ok = false;
      metrics_.on_rejected(outcomes[i].reason);
    }
  }
  // A failed call says nothing about how long a successful one takes.
  if (all_ok) keys_[batch.affinity_key].latency.record(batch.requests.size(), now - batch.started);
}

void SchedulerCore::seed_latency(const std::string& key, std::size_t batch_size, Nanos latency) {
  LATTE_EXPECTS(!key.empty(), "affinity_key must be a non-empty string");
  LATTE_EXPECTS(batch_size >= 1 && batch_size <= config_.max_batch_size,
                "batch_size must be in [1, max_batch_size]");
  LATTE_EXPECTS(latency >= 0, "latency must be >= 0 nanoseconds");
  keys_[key].latency.record(batch_size, latency);
}

std::size_t SchedulerCore::queued_on(std::size_t lane) const {
  LATTE_EXPECTS(lane < lanes_.size(), "lane does not exist");
  return lanes_[lane].queued;
}

std::size_t SchedulerCore::lane_of(const std::string& key) const {
  auto it = group_lane_.find(key);
  LATTE_EXPECTS(it != group_lane_.end(), "no queued group for key '" + key + "'");
  return it->second;
}

const LatencyModel* SchedulerCore::latency_model(const std::string& key) const {
  auto it = keys_.find(key);
  return it == keys_.end() ? nullptr : &it->second.latency;
}

MetricsSnapshot SchedulerCore::metrics() const { return metrics_.snapshot(depth_); }

void SchedulerCore::check_invariants_(bool) const {
  std::size_t total = 0, by_priority = 0;
  for (std::size_t l = 0; l < lanes_.size(); ++l) {
    std::size_t on_lane = 0;
    for (const auto& [key, group] : lanes_[l].groups) {
      if (group.requests.empty()) throw std::logic_error("empty group kept for " + key);
      if (group_lane_.at(key) != l) throw std::logic_error("group_lane_ out of date for " + key);
      on_lane += group.requests.size();
    }
    if (on_lane != lanes_[l].queued) throw std::logic_error("lane queued count out of date");
    total += on_lane;
  }
  for (auto d : depth_) by_priority += d;
  if (total != queued_ || by_priority != queued_) throw std::logic_error("queued count out of date");
}

}  // namespace latte::scheduling
