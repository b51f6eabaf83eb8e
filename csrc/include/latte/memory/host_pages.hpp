#pragma once
// Physical pages for BuddyArena's paged mode on the host: a memfd of the capacity (hugetlb
// where the machine has enough free huge pages) whose pages are mapped with MAP_FIXED into
// a reserved range of virtual addresses. Construction throws latte::bad_alloc naming the
// reason when the machine cannot do this (no memfd, no room to reserve the range).
#include <cstddef>
#include <cstdint>

#include "latte/memory/detail/page_table.hpp"

namespace latte::memory {

struct HostPagesOptions {
  std::size_t page_bytes = 1u << 20;  // power of two, a multiple of the system page
  unsigned virtual_factor = 4;        // the reserved range, in multiples of the capacity
  bool prefault = true;               // MAP_POPULATE: a page is faulted in when it is mapped
  std::size_t mapping_limit = 0;      // the process's mappings at most; 0: the system's vm.max_map_count
  std::uint32_t idle_share = 0;       // PageMapper::idle_share (0: idle pages kept until the memory runs out)
};

class HostPages final : public detail::PageMapper {
 public:
  HostPages(std::size_t capacity, HostPagesOptions options = {});
  ~HostPages() override;
  HostPages(const HostPages&) = delete;
  HostPages& operator=(const HostPages&) = delete;

  std::byte* base() const noexcept override { return base_; }
  std::size_t page_bytes() const noexcept override { return page_bytes_; }
  std::uint32_t virtual_pages() const noexcept override { return virtual_pages_; }
  std::uint32_t physical_pages() const noexcept override { return physical_pages_; }
  const char* kind() const noexcept override { return hugetlb_ ? "memfd-hugetlb" : "memfd"; }
  std::uint32_t idle_share() const noexcept override { return idle_share_; }

  bool map(std::uint32_t first, std::uint32_t physical, std::uint32_t count) noexcept override;
  bool unmap(std::uint32_t first, std::uint32_t count) noexcept override;
  void discard(std::uint32_t physical, std::uint32_t count) noexcept override;
  const char* refusal() const noexcept override {
    return "the system refused to map or unmap its pages (the process's mappings may be at vm.max_map_count)";
  }

 private:
  std::size_t page_bytes_;
  bool prefault_;
  std::uint32_t idle_share_;
  bool hugetlb_ = false;
  int fd_ = -1;
  std::byte* base_ = nullptr;
  std::uint32_t physical_pages_ = 0;
  std::uint32_t virtual_pages_ = 0;
  std::size_t promised_ = 0;          // mappings this arena may need, counted against the process's limit
};

}  // namespace latte::memory
