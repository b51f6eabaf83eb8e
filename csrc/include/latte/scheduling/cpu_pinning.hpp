#pragma once
// Pins the calling thread to a set of CPUs; reports rather than fails where that is not allowed.
#include <string>
#include <vector>

namespace latte::scheduling {

struct PinningResult {
  bool pinned = false;
  std::string message;  // why not, when !pinned and a CPU set was asked for
};

// An empty set leaves the thread unpinned.
PinningResult pin_current_thread(const std::vector<int>& cpus);

}  // namespace latte::scheduling
