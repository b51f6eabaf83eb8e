// Shared library for torch.cuda.memory.CUDAPluggableAllocator: one BuddyArena per device over
// a single cudaMalloc'd region. Capacity: LATTE_CUDA_ARENA_BYTES, or 80% of the device's free
// memory when the first allocation on that device happens.
#include <cuda_runtime_api.h>
#include <sys/types.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#include "latte/memory/arena_stack.hpp"

namespace {

constexpr int kMaxDevices = 64;

std::mutex arenas_mutex;
std::array<std::unique_ptr<latte::memory::ArenaStack>, kMaxDevices> arenas;

latte::memory::ArenaStack* arena_for(int device) {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  std::lock_guard<std::mutex> lock(arenas_mutex);
  if (!arenas[device]) {
    std::size_t capacity = 0;
    if (const char* env = std::getenv("LATTE_CUDA_ARENA_BYTES")) capacity = std::strtoull(env, nullptr, 10);
    if (capacity == 0) {
      std::size_t free_bytes = 0, total_bytes = 0;
      if (cudaSetDevice(device) != cudaSuccess || cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
        return nullptr;
      }
      capacity = free_bytes / 10 * 8;
    }
    latte::memory::ArenaStackOptions options;
    options.capacity = capacity;
    options.device = latte::memory::Device::cuda;
    options.device_id = device;
    // Pages of the device under each block (DevicePages), where the driver can map them.
    if (const char* env = std::getenv("LATTE_CUDA_ARENA_PAGES")) options.paged = std::strcmp(env, "1") == 0;
    try {
      arenas[device] = std::make_unique<latte::memory::ArenaStack>(options);
    } catch (const std::exception&) {
      return nullptr;
    }
  }
  return arenas[device].get();
}

}  // namespace

extern "C" {

// The stream is not used: blocks are reusable as soon as they are freed (see docs/memory.md).
__attribute__((visibility("default"))) void* latte_malloc(ssize_t size, int device, cudaStream_t) {
  latte::memory::ArenaStack* arena = arena_for(device);
  if (arena == nullptr || size < 0) return nullptr;
  try {
    return arena->resource().allocate(static_cast<std::size_t>(size));
  } catch (const std::exception&) {
    return nullptr;  // PyTorch turns a null pointer into torch.OutOfMemoryError
  }
}

// Figures of the device's arena, for callers that cannot see inside a pluggable allocator
// (torch.cuda.memory_stats() reads zeros for it). Fills `out` with kFigureCount values in
// the order of latte.memory.TORCH_ARENA_FIGURES; returns 0, or -1 when the device has no arena yet.
__attribute__((visibility("default"))) int latte_arena_figures(int device, unsigned long long* out, int count) {
  if (out == nullptr || count <= 0 || device < 0 || device >= kMaxDevices) return -1;
  latte::memory::ArenaStack* arena = nullptr;
  {
    std::lock_guard<std::mutex> lock(arenas_mutex);
    arena = arenas[device].get();
  }
  if (arena == nullptr) return -1;
  const latte::memory::Statistics s = arena->statistics();
  // A paged arena's pages (0 otherwise): physical_held is the device memory it holds, as pages
  // are made on their first map and released only by release_cached, which no caller here makes.
  const unsigned long long figures[] = {s.capacity,    s.live,           s.allocated,
                                        s.peak_live,   s.peak_allocated, s.largest_free,
                                        s.allocations, s.failures,       s.fragmentation_failures,
                                        s.page_bytes,  s.physical_held,  s.mapped,
                                        s.map_calls,   s.unmap_calls};
  constexpr int kFigureCount = sizeof(figures) / sizeof(figures[0]);
  std::memcpy(out, figures, sizeof(unsigned long long) * static_cast<std::size_t>(count < kFigureCount ? count : kFigureCount));
  return 0;
}

// Walks the device arena's bookkeeping (debug aid for tests; not concurrent with allocations).
// Returns 0 when every invariant holds, 1 when one is broken (its name in `message`), -1 when
// the device has no arena yet.
__attribute__((visibility("default"))) int latte_arena_check(int device, char* message, int capacity) {
  if (device < 0 || device >= kMaxDevices) return -1;
  latte::memory::ArenaStack* arena = nullptr;
  {
    std::lock_guard<std::mutex> lock(arenas_mutex);
    arena = arenas[device].get();
  }
  if (arena == nullptr) return -1;
  try {
    arena->arena().check_invariants();
  } catch (const std::exception& error) {
    if (message != nullptr && capacity > 0) {
      std::strncpy(message, error.what(), static_cast<std::size_t>(capacity) - 1);
      message[capacity - 1] = '\0';
    }
    return 1;
  }
  return 0;
}

__attribute__((visibility("default"))) void latte_free(void* ptr, ssize_t size, int device, cudaStream_t) {
  if (ptr == nullptr || device < 0 || device >= kMaxDevices) return;
  latte::memory::ArenaStack* arena = arenas[device].get();
  if (arena != nullptr) arena->resource().deallocate(ptr, static_cast<std::size_t>(size));
}

}  // extern "C"
