#pragma once
// Device memory from cudaMalloc on one device. Compiled only when the CUDA toolkit is found
// (LATTE_WITH_CUDA); the arena above it keeps all bookkeeping on the host.
#include <cstddef>

#include "latte/memory/memory_resource.hpp"

namespace latte::memory {

class CudaDeviceResource final : public MemoryResource {
 public:
  explicit CudaDeviceResource(int device);
  int device() const noexcept { return device_; }

 private:
  void* do_allocate(std::size_t bytes) override;
  void do_deallocate(void* ptr, std::size_t bytes) noexcept override;

  int device_;
};

}  // namespace latte::memory
