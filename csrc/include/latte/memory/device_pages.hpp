#pragma once
// Physical pages for BuddyArena's paged mode on a CUDA device, with the driver's virtual memory
// calls: a reserved range of device addresses (cuMemAddressReserve) over which pages of the
// device's allocation granularity (cuMemCreate) are mapped (cuMemMap, cuMemSetAccess) under
// each block as it is taken. As vLLM's CuMemAllocator and PyTorch's expandable segments do, a
// large block needs no contiguous physical memory. The driver's entry points come through the
// CUDA runtime (cudaGetDriverEntryPointByVersion), so nothing links libcuda. Compiled only with
// the CUDA toolkit (LATTE_WITH_CUDA); construction throws latte::bad_alloc naming the reason
// when the machine cannot (no device, no driver, no virtual memory management).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "latte/memory/detail/page_table.hpp"

namespace latte::memory {

struct DevicePagesOptions {
  std::size_t page_bytes = 2u << 20;  // rounded up to a multiple of the device's granularity
  unsigned virtual_factor = 4;        // the reserved range, in multiples of the capacity
  // PageMapper::idle_share: idle pages beyond half the pages in use are remapped. Replayed from
  // two models' recorded allocations (benchmarks/gpu_trace.py), a share of 8 held 1.02x and
  // 1.14x the live bytes with 48 and 241 evictions (each a wait for the device) in 6,000
  // steps; 2 holds 1.29x and 1.18x with 15 and 20, and 0 (keep all) 1.30x and 1.48x. On an
  // H200 the 6-layer encoder held more than its replay at 2 (1.40x, 31 evictions against 306).
  std::uint32_t idle_share = 2;
};

class DevicePages final : public detail::PageMapper {
 public:
  DevicePages(std::size_t capacity, int device, DevicePagesOptions options = {});
  ~DevicePages() override;
  DevicePages(const DevicePages&) = delete;
  DevicePages& operator=(const DevicePages&) = delete;

  std::byte* base() const noexcept override { return base_; }
  std::size_t page_bytes() const noexcept override { return page_bytes_; }
  std::uint32_t virtual_pages() const noexcept override { return virtual_pages_; }
  std::uint32_t physical_pages() const noexcept override { return physical_pages_; }
  const char* kind() const noexcept override { return "cuda"; }
  std::uint32_t idle_share() const noexcept override { return idle_share_; }
  int device() const noexcept { return device_; }

  // A physical page's memory is created on its first map and released by discard.
  bool map(std::uint32_t first, std::uint32_t physical, std::uint32_t count) noexcept override;
  bool unmap(std::uint32_t first, std::uint32_t count) noexcept override;
  std::uint32_t unmap_each(const std::uint32_t* pages, std::uint32_t count) noexcept override;
  void discard(std::uint32_t physical, std::uint32_t count) noexcept override;
  const char* refusal() const noexcept override {
    return "the driver refused to map or unmap its pages (cuMemCreate may have found no free device memory)";
  }

  struct Driver;  // the entry points, resolved once

 private:
  bool unmap_page(std::uint32_t page) noexcept;

  const Driver* driver_;
  int device_;
  void* context_ = nullptr;                  // the device's primary context, retained
  std::size_t page_bytes_ = 0;
  std::byte* base_ = nullptr;
  std::uint32_t physical_pages_ = 0;
  std::uint32_t virtual_pages_ = 0;
  std::uint32_t idle_share_ = 0;
  std::vector<unsigned long long> handles_;  // per physical page: its allocation, 0 when none
  std::vector<std::uint8_t> created_;        // per physical page: made by the map call under way
  std::vector<std::uint32_t> mapped_;        // per virtual page: its physical page + 1, 0 when unmapped
};

}  // namespace latte::memory
