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
#include <stdexcept>
#include <string>

#include "latte/memory/arena_stack.hpp"

namespace {

constexpr int kMaxDevices = 64;

std::mutex arenas_mutex;
std::array<std::unique_ptr<latte::memory::ArenaStack>, kMaxDevices> arenas;

// The device's arena, made on its first use; null when it cannot be, with the reason in `why`.
latte::memory::ArenaStack* arena_for(int device, std::string* why = nullptr) {
  if (device < 0 || device >= kMaxDevices) {
    if (why) *why = "device " + std::to_string(device) + " is outside 0.." + std::to_string(kMaxDevices - 1);
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(arenas_mutex);
  if (!arenas[device]) {
    std::size_t capacity = 0;
    if (const char* env = std::getenv("LATTE_CUDA_ARENA_BYTES")) capacity = std::strtoull(env, nullptr, 10);
    if (capacity == 0) {
      std::size_t free_bytes = 0, total_bytes = 0;
      if (cudaSetDevice(device) != cudaSuccess || cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
        if (why) *why = "cannot read device " + std::to_string(device) + "'s free memory";
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
    } catch (const std::exception& error) {
      if (why) *why = error.what();
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
    return nullptr;  // a caching allocator above (torch.cuda.MemPool) frees its cache, retries, then raises OOM
  }
}

// The same for PyTorch's process-wide allocator: a refusal is thrown, as PyTorch's own allocator
// throws, so the caller's Python sees a RuntimeError saying why. A null pointer there is not
// checked by every operator: a fill launched on it faults and leaves the CUDA context unusable.
__attribute__((visibility("default"))) void* latte_torch_malloc(ssize_t size, int device, cudaStream_t) {
  std::string why;
  latte::memory::ArenaStack* arena = arena_for(device, &why);
  if (arena == nullptr) throw std::runtime_error("CUDA out of memory: latte has no device arena: " + why);
  if (size < 0) throw std::invalid_argument("latte device arena: negative size " + std::to_string(size));
  try {
    return arena->resource().allocate(static_cast<std::size_t>(size));
  } catch (const std::bad_alloc& error) {
    throw std::runtime_error(std::string("CUDA out of memory: latte device arena on device ") +
                             std::to_string(device) + ": " + error.what());
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
