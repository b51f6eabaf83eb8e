#pragma once
// What is scheduled (Request), what runs (Batch) and how each request ends (Outcome).
#include <cstdint>
#include <string>
#include <vector>

#include "latte/scheduling/clock.hpp"

namespace latte::scheduling {

// Priority levels are 0 (lowest) .. kPriorityLevels-1 (highest): the levels a request's
// priority_level parameter may name (exported as latte._native.PRIORITY_LEVELS, which the
// backend's option parser reads, so both sides accept the same range).
constexpr int kPriorityLevels = 16;

struct Request {
  std::uint64_t id = 0;
  std::string affinity_key;  // model/session/shape bucket: requests of one key batch together
  int priority = 0;
  Nanos deadline = kNoDeadline;  // absolute, on the scheduler's clock
  std::uint64_t size = 1;        // tokens or bytes; counted against the batch byte budget
};

struct QueuedRequest {
  Request request;
  Nanos submitted = 0;
  std::uint64_t sequence = 0;  // admission order, breaks ties so ordering is total
};

struct Batch {
  std::string affinity_key;
  std::size_t lane = 0;
  std::vector<QueuedRequest> requests;
  std::uint64_t bytes = 0;
  bool flushed_by_timeout = false;  // the adaptive window expired before the target size was reached
  bool stolen = false;              // the group was taken from another lane's queue
  bool affinity_hit = false;        // this lane was the last to run the key
  Nanos started = 0;
};

enum class RejectReason {
  kQueueFull,        // admission: the bounded queue is full of work at least as important
  kDeadlinePassed,   // admission: the deadline was already over when submitted
  kTooLarge,         // admission: size exceeds the batch byte budget, so it could never run
  kDeadlineExpired,  // queued: the deadline passed before a lane could start it
  kDisplaced,        // queued: pushed out of a full queue by a higher-priority request
  kShutdown,         // queued or submitted while the scheduler shuts down without draining
  kExecuteFailed,    // ran: the model call raised
};

// Every reason, in declaration order: the one list the Python module exports.
inline constexpr RejectReason kRejectReasons[] = {
    RejectReason::kQueueFull,       RejectReason::kDeadlinePassed, RejectReason::kTooLarge,
    RejectReason::kDeadlineExpired, RejectReason::kDisplaced,      RejectReason::kShutdown,
    RejectReason::kExecuteFailed};

// The reason's name as callers see it (on_complete's reason string, metric labels).
const char* reason_name(RejectReason reason) noexcept;

struct Outcome {
  std::uint64_t id = 0;
  bool ok = true;
  RejectReason reason = RejectReason::kExecuteFailed;  // meaningful only when !ok
  std::string detail;                                  // the model's error message for kExecuteFailed
};

}  // namespace latte::scheduling
