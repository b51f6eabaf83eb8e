#pragma once
// The usual assembly, in one object: backing resource -> BuddyArena -> optional limit ->
// statistics. Used by the Python module and the PyTorch allocator plug-in.
#include <cstddef>
#include <memory>
#include <string>

#include "latte/memory/arena_statistics.hpp"
#include "latte/memory/buddy_arena.hpp"
#include "latte/memory/limiting_adaptor.hpp"
#include "latte/memory/memory_resource.hpp"
#include "latte/memory/statistics_adaptor.hpp"

namespace latte::memory {

enum class Device { cpu, cuda };

struct ArenaStackOptions {
  std::size_t capacity = 0;
  Device device = Device::cpu;
  int device_id = 0;
  ArenaOptions arena = {};
  std::size_t limit = 0;  // 0: no limit below the capacity
  bool prefault = true;   // host only
  bool pin = true;        // host only: cudaHostRegister when a CUDA device exists
  // Physical pages mapped under each block (BuddyArena's paged mode), so a request fails only
  // when the bytes are not there: a memfd's on the host, the driver's (DevicePages) on a CUDA
  // device, where page_bytes rounds up to the device's granularity. Where the machine cannot
  // (no memfd; no device, driver or virtual memory management), the plain buddy serves and
  // fallback_reason() says why.
  bool paged = false;
  std::size_t page_bytes = 1u << 20;
  unsigned virtual_factor = 4;
  // PageMapper::idle_share; -1: the pages' own (the host keeps idle pages until the memory
  // runs out, a device remaps those beyond half the pages in use).
  int idle_share = -1;
};

class ArenaStack {
 public:
  explicit ArenaStack(const ArenaStackOptions& options);
  ~ArenaStack();

  MemoryResource& resource() noexcept { return *statistics_; }
  Statistics statistics() const noexcept { return arena_statistics(arena_->usage(), statistics_->counters()); }
  BuddyArena& arena() noexcept { return *arena_; }
  const ArenaStackOptions& options() const noexcept { return options_; }
  bool pinned() const noexcept { return pinned_; }
  // Why a paged arena was asked for and a plain one serves ("" when none was refused).
  const std::string& fallback_reason() const noexcept { return fallback_reason_; }

 private:
  void make_plain_arena(const ArenaStackOptions& options);

  ArenaStackOptions options_;
  std::unique_ptr<MemoryResource> backing_;
  std::unique_ptr<BuddyArena> arena_;
  std::unique_ptr<LimitingAdaptor> limit_;
  std::unique_ptr<StatisticsAdaptor> statistics_;
  bool pinned_ = false;
  std::string fallback_reason_;
};

// Whether this build can place arenas in CUDA device memory.
bool cuda_device_memory_compiled() noexcept;

}  // namespace latte::memory
