#include "latte/scheduling/cpu_pinning.hpp"

#include <cstring>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

namespace latte::scheduling {

PinningResult pin_current_thread(const std::vector<int>& cpus) {
  PinningResult result;
  if (cpus.empty()) return result;
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) {
    if (cpu < 0 || cpu >= CPU_SETSIZE) {
      result.message = "cpu " + std::to_string(cpu) + " is outside 0.." +
                       std::to_string(CPU_SETSIZE - 1);
      return result;
    }
    CPU_SET(cpu, &set);
  }
  const int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  if (rc != 0) {
    result.message = std::string("pthread_setaffinity_np failed: ") + std::strerror(rc);
    return result;
  }
  result.pinned = true;
#else
  result.message = "thread pinning is only implemented on Linux";
#endif
  return result;
}

}  // namespace latte::scheduling
