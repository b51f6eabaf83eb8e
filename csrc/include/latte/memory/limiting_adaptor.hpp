#pragma once
// Refuses requests once the bytes handed out would exceed a limit: lets tests and callers
// force out-of-memory without exhausting the real upstream.
#include <atomic>
#include <cstddef>

#include "latte/memory/memory_resource.hpp"

namespace latte::memory {

class LimitingAdaptor final : public MemoryResource {
 public:
  LimitingAdaptor(MemoryResource& upstream, std::size_t limit_bytes)
      : upstream_(upstream), limit_(limit_bytes) {}

  std::size_t limit() const noexcept { return limit_; }
  std::size_t used() const noexcept { return used_.load(std::memory_order_relaxed); }

 private:
  void* do_allocate(std::size_t bytes) override;
  void do_deallocate(void* ptr, std::size_t bytes) noexcept override;

  MemoryResource& upstream_;
  const std::size_t limit_;
  std::atomic<std::size_t> used_{0};
};

}  // namespace latte::memory
