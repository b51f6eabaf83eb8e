#pragma once
// One small allocate/deallocate interface; concrete resources and adaptors implement it and
// adaptors wrap an upstream resource, so backing memory, arenas and bookkeeping compose.
#include <cstddef>
#include <optional>

namespace latte::memory {

// Occupancy of an arena, as far as a resource can tell. Adaptors forward their upstream's.
struct ArenaUsage {
  std::size_t capacity = 0;       // bytes managed
  std::size_t reserved = 0;       // bytes taken out of the buddy lists (blocks and slabs)
  std::size_t allocated = 0;      // bytes of live allocations after rounding
  std::size_t free = 0;           // capacity - reserved
  std::size_t largest_free = 0;   // largest single free block
  std::size_t peak_reserved = 0;
  std::size_t peak_allocated = 0;
};

class MemoryResource {
 public:
  virtual ~MemoryResource() = default;

  // Returns at least `bytes` bytes (nullptr for 0); throws bad_alloc/out_of_memory on failure.
  void* allocate(std::size_t bytes) { return do_allocate(bytes); }

  // `bytes` must be the size passed to allocate. Never throws: freeing cannot be allowed to fail.
  void deallocate(void* ptr, std::size_t bytes) noexcept { do_deallocate(ptr, bytes); }

  virtual std::optional<ArenaUsage> usage() const { return std::nullopt; }

 private:
  virtual void* do_allocate(std::size_t bytes) = 0;
  virtual void do_deallocate(void* ptr, std::size_t bytes) noexcept = 0;
};

}  // namespace latte::memory
