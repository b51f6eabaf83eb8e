#include "latte/memory/limiting_adaptor.hpp"

#include <string>

#include "latte/error.hpp"

namespace latte::memory {

void* LimitingAdaptor::do_allocate(std::size_t bytes) {
  std::size_t used = used_.load(std::memory_order_relaxed);
  // Claim the bytes before asking upstream so concurrent callers cannot overshoot together.
  do {
    if (bytes > limit_ - used) {
      throw out_of_memory("LimitingAdaptor: cannot allocate " + std::to_string(bytes) +
                          " bytes: " + std::to_string(used) + " of the " +
                          std::to_string(limit_) + "-byte limit in use");
    }
  } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
  try {
    return upstream_.allocate(bytes);
  } catch (...) {
    used_.fetch_sub(bytes, std::memory_order_relaxed);
    throw;
  }
}

void LimitingAdaptor::do_deallocate(void* ptr, std::size_t bytes) noexcept {
  upstream_.deallocate(ptr, bytes);
  if (ptr != nullptr) used_.fetch_sub(bytes, std::memory_order_relaxed);
}

}  // namespace latte::memory
