#pragma once
// One small allocate/deallocate interface; concrete resources and adaptors implement it and
// adaptors wrap an upstream resource, so backing memory, arenas and bookkeeping compose.
// Like RMM's device_memory_resource it knows nothing of arenas: what only an arena can
// say (its occupancy) is asked of the BuddyArena itself.
#include <cstddef>

namespace latte::memory {

class MemoryResource {
 public:
  virtual ~MemoryResource() = default;

  // Returns at least `bytes` bytes (nullptr for 0); throws bad_alloc/out_of_memory on failure.
  void* allocate(std::size_t bytes) { return do_allocate(bytes); }

  // `bytes` must be the size passed to allocate. Never throws: freeing cannot be allowed to fail.
  void deallocate(void* ptr, std::size_t bytes) noexcept { do_deallocate(ptr, bytes); }

 private:
  virtual void* do_allocate(std::size_t bytes) = 0;
  virtual void do_deallocate(void* ptr, std::size_t bytes) noexcept = 0;
};

}  // namespace latte::memory
