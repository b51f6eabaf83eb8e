#include "latte/memory/arena_stack.hpp"

#include <new>
#include <string>

#include "latte/error.hpp"
#include "latte/memory/host_pages.hpp"
#include "latte/memory/host_resource.hpp"
#ifdef LATTE_WITH_CUDA
#include "latte/memory/cuda_device_resource.hpp"
#include "latte/memory/device_pages.hpp"
#endif

namespace latte::memory {
namespace {

HostPagesOptions host_pages_options(const ArenaStackOptions& options) {
  HostPagesOptions pages;
  pages.page_bytes = options.page_bytes;
  pages.virtual_factor = options.virtual_factor;
  pages.prefault = options.prefault;
  if (options.idle_share >= 0) pages.idle_share = static_cast<std::uint32_t>(options.idle_share);
  return pages;
}

#ifdef LATTE_WITH_CUDA
DevicePagesOptions device_pages_options(const ArenaStackOptions& options) {
  DevicePagesOptions pages;
  pages.page_bytes = options.page_bytes;
  pages.virtual_factor = options.virtual_factor;
  if (options.idle_share >= 0) pages.idle_share = static_cast<std::uint32_t>(options.idle_share);
  return pages;
}
#endif

}  // namespace

bool cuda_device_memory_compiled() noexcept {
#ifdef LATTE_WITH_CUDA
  return true;
#else
  return false;
#endif
}

ArenaStack::ArenaStack(const ArenaStackOptions& options) : options_(options) {
  if (options.paged && options.device == Device::cpu) {
    try {
      arena_ = std::make_unique<BuddyArena>(
          std::make_unique<HostPages>(options.capacity, host_pages_options(options)),
          options.arena);
    } catch (const bad_alloc& refused) {  // the machine cannot map pages: the plain buddy serves
      fallback_reason_ = refused.what();
    } catch (const std::bad_alloc&) {     // no memory for the page table of so many pages
      fallback_reason_ = "paged arena: no memory for the page table of " +
                         std::to_string(options.capacity / options.page_bytes) + " pages; raise page_bytes";
    }
  } else if (options.paged) {
#ifdef LATTE_WITH_CUDA
    try {
      arena_ = std::make_unique<BuddyArena>(
          std::make_unique<DevicePages>(options.capacity, options.device_id, device_pages_options(options)),
          options.arena);
    } catch (const bad_alloc& refused) {  // no device, driver or virtual memory management here
      fallback_reason_ = refused.what();
    } catch (const std::bad_alloc&) {
      fallback_reason_ = "paged device arena: no memory for the page table of " +
                         std::to_string(options.capacity / options.page_bytes) + " pages; raise page_bytes";
    }
#else
    fallback_reason_ = "paged device memory needs Latte built with the CUDA toolkit (this build has none)";
#endif
  }
  if (arena_ == nullptr) make_plain_arena(options);
  MemoryResource* top = arena_.get();
  if (options.limit != 0) {
    limit_ = std::make_unique<LimitingAdaptor>(*top, options.limit);
    top = limit_.get();
  }
  const std::size_t room = options.limit != 0 && options.limit < arena_->capacity() ? options.limit : arena_->capacity();
  statistics_ = std::make_unique<StatisticsAdaptor>(*top, room);
}

void ArenaStack::make_plain_arena(const ArenaStackOptions& options) {
  if (options.device == Device::cuda) {
#ifdef LATTE_WITH_CUDA
    backing_ = std::make_unique<CudaDeviceResource>(options.device_id);
#else
    throw logic_error("device 'cuda' needs Latte built with the CUDA toolkit (this build has none)");
#endif
  } else {
    backing_ = std::make_unique<HostResource>(HostResourceOptions{options.prefault, options.pin});
  }
  arena_ = std::make_unique<BuddyArena>(*backing_, options.capacity, options.arena);
  if (options.device == Device::cpu) {
    pinned_ = static_cast<HostResource&>(*backing_).is_pinned(arena_->base());
  }
}

ArenaStack::~ArenaStack() {
  // Adaptors first, then the arena, then the memory under it.
  statistics_.reset();
  limit_.reset();
  arena_.reset();
  backing_.reset();
}

}  // namespace latte::memory
