#include "latte/scheduling/request.hpp"

namespace latte::scheduling {

const char* reason_name(RejectReason reason) noexcept {
  switch (reason) {
    case RejectReason::kQueueFull: return "queue_full";
    case RejectReason::kDeadlinePassed: return "deadline_passed";
    case RejectReason::kTooLarge: return "too_large";
    case RejectReason::kDeadlineExpired: return "deadline_expired";
    case RejectReason::kDisplaced: return "displaced";
    case RejectReason::kShutdown: return "shutdown";
    case RejectReason::kExecuteFailed: return "execute_failed";
  }
  return "unknown";
}

}  // namespace latte::scheduling
