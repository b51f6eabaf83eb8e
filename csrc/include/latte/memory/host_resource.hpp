#pragma once
// Host memory straight from the kernel: mmap'd, pre-faulted so the first touch costs
// nothing, and page-locked with cudaHostRegister when a CUDA runtime and device exist
// (libcudart is loaded at run time, so there is no link-time dependency on CUDA).
#include <cstddef>
#include <mutex>
#include <unordered_map>

#include "latte/memory/memory_resource.hpp"

namespace latte::memory {

struct HostResourceOptions {
  bool prefault = true;  // MAP_POPULATE: pay the page faults once, at reservation
  bool pin = true;       // try cudaHostRegister (silently skipped without CUDA)
};

class HostResource final : public MemoryResource {
 public:
  explicit HostResource(HostResourceOptions options = {}) : options_(options) {}
  ~HostResource() override;

  // Whether the mapping at ptr was page-locked for DMA.
  bool is_pinned(const void* ptr) const;
  // Whether a CUDA runtime with at least one device could be loaded.
  static bool cuda_runtime_available();

 private:
  void* do_allocate(std::size_t bytes) override;
  void do_deallocate(void* ptr, std::size_t bytes) noexcept override;

  HostResourceOptions options_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, bool> pinned_;  // live mappings -> page-locked or not
};

}  // namespace latte::memory
