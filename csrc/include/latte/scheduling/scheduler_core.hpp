#pragma once
// The scheduling decisions without threads: callers pass the time in, so a test can step it.
// Not thread-safe; AffinityScheduler serialises access with one mutex.
#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "latte/scheduling/clock.hpp"
#include "latte/scheduling/latency_model.hpp"
#include "latte/scheduling/metrics.hpp"
#include "latte/scheduling/request.hpp"

namespace latte::scheduling {

// The longest max_window a scheduler accepts: holding a batch back longer is a misconfiguration.
inline constexpr Nanos kMaxWindowLimit = 10'000'000'000;

struct SchedulerConfig {
  std::size_t lanes = 1;
  std::size_t max_batch_size = 8;
  std::uint64_t max_batch_bytes = 1 << 20;
  std::size_t queue_capacity = 1024;  // requests queued across all lanes
  Nanos max_window = 2'000'000;       // longest the adaptive window may hold a batch back
  // The window aims for batches large enough that the lane stays below this utilisation.
  double target_utilization = 0.8;
  // A key with no queued group goes back to the lane that last ran it unless that lane has
  // this many more queued requests than the least loaded lane.
  std::size_t placement_slack = 8;
  std::size_t recent_keys_per_lane = 4;  // what "touched recently" means for stealing
  // An idle lane steals only from a lane with at least this many queued requests: a single
  // request is usually better served warm, a moment later, by the lane that holds it.
  std::size_t steal_min_queued = 2;
};

struct Decision {
  enum class Kind { kRun, kWait, kIdle };
  Kind kind = Kind::kIdle;
  Batch batch;       // kRun
  Nanos wake_at = 0; // kWait: ask again at this time (or sooner, when requests arrive)
};

class SchedulerCore {
 public:
  explicit SchedulerCore(SchedulerConfig config);

  // Admits the request or says why not; an admitted request is answered later exactly once,
  // through a Batch or take_rejections(). Throws latte::logic_error for a malformed request.
  std::optional<RejectReason> submit(const Request& request, Nanos now);

  // What `lane` should do now: run a batch, wait for more requests until wake_at, or idle.
  Decision next_batch(std::size_t lane, Nanos now);
  // The batch the lane would run next if nothing changes; a hint for staging inputs.
  std::optional<Batch> peek_next(std::size_t lane) const;
  // The lane finished `batch`: feeds the latency model and the metrics.
  void complete(const Batch& batch, const std::vector<Outcome>& outcomes, Nanos now);

  // Primes a key's latency model from a profile (e.g. warm-up runs) before live batches exist.
  void seed_latency(const std::string& key, std::size_t batch_size, Nanos latency);

  // Requests rejected after admission (expired, displaced, shut down), each returned once.
  std::vector<Outcome> take_rejections();
  void reject_all(RejectReason reason);
  // While draining, the window never holds a batch back.
  void set_draining(bool draining) noexcept { draining_ = draining; }

  std::size_t queued() const noexcept { return queued_; }
  std::size_t queued_on(std::size_t lane) const;
  std::size_t lane_of(const std::string& key) const;  // lane holding the key's queued group
  bool has_group(const std::string& key) const { return group_lane_.count(key) != 0; }
  const LatencyModel* latency_model(const std::string& key) const;
  // The batch size the window aims for (1 = no reason to wait).
  std::size_t target_batch_size(const std::string& key, Nanos now) const;
  MetricsSnapshot metrics() const;
  const SchedulerConfig& config() const noexcept { return config_; }

 private:
  // Most urgent first: higher priority, then earlier deadline, then admission order.
  struct MoreUrgent {
    bool operator()(const QueuedRequest& x, const QueuedRequest& y) const noexcept;
  };
  struct Group {
    std::set<QueuedRequest, MoreUrgent> requests;
    std::uint64_t bytes = 0;
    Nanos hold_until = -1;  // set once the window decides to wait, so it cannot slide forward
    bool stolen = false;
  };
  struct Lane {
    std::map<std::string, Group> groups;
    std::size_t queued = 0;
    bool busy = false;
    std::deque<std::string> recent_keys;  // most recent first
  };
  struct KeyState {
    std::optional<std::size_t> last_lane;
    LatencyModel latency;
    ArrivalRate arrivals;
  };

  std::size_t place(const std::string& key, int priority) const;
  void expire(Nanos now);
  bool steal_into(std::size_t thief);
  std::map<std::string, Group>::iterator most_urgent_group(Lane& lane);
  bool should_wait(const std::string& key, Group& group, const Lane& lane, Nanos now,
                   Nanos* wake_at, bool* window_expired);
  Batch take_batch(std::size_t lane_index, std::map<std::string, Group>::iterator group,
                   Nanos now, bool window_expired);
  void remove_request(std::size_t lane_index, Group& group,
                      std::set<QueuedRequest, MoreUrgent>::iterator it, RejectReason reason);
  bool displace_less_urgent_than(const Request& request);
  void touch(Lane& lane, const std::string& key);
  void check_invariants_(bool) const;

  SchedulerConfig config_;
  std::vector<Lane> lanes_;
  std::unordered_map<std::string, std::size_t> group_lane_;
  std::unordered_map<std::string, KeyState> keys_;
  std::unordered_set<std::uint64_t> open_ids_;  // queued or running, to refuse reused ids
  std::array<std::uint64_t, kPriorityLevels> depth_{};
  std::vector<Outcome> rejections_;
  Metrics metrics_;
  std::size_t queued_ = 0;
  std::uint64_t sequence_ = 0;
  bool draining_ = false;
};

}  // namespace latte::scheduling
