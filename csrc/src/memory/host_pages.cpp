#include "latte/memory/host_pages.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>

#include "latte/error.hpp"

namespace latte::memory {
namespace {

constexpr int kReserve = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;

std::string system_error(const char* call) { return std::string(call) + ": " + std::strerror(errno); }

// Free huge pages of `bytes` each, from /proc/meminfo (0 when unknown or of another size).
std::size_t free_huge_pages(std::size_t bytes) {
  std::FILE* file = std::fopen("/proc/meminfo", "r");
  if (file == nullptr) return 0;
  char line[256];
  std::size_t free = 0, size_kib = 0;
  while (std::fgets(line, sizeof line, file)) {
    unsigned long value = 0;
    if (std::sscanf(line, "HugePages_Free: %lu", &value) == 1) free = value;
    if (std::sscanf(line, "Hugepagesize: %lu kB", &value) == 1) size_kib = value;
  }
  std::fclose(file);
  return size_kib * 1024 == bytes ? free : 0;
}

// Mappings that the process's live paged arenas may need at worst. Each arena's check counts the
// others' promises, so that two arenas cannot both count on the same room below the limit (the
// mappings they have now are in /proc/self/maps as well: the check errs on the side of refusing).
std::mutex promises_mutex;
std::size_t promised_mappings = 0;

// The system's limit on a process's mappings (`limit` when given), and how many it has now (0, 0
// when unknown).
std::pair<std::size_t, std::size_t> mapping_limit(std::size_t limit) {
  std::size_t in_use = 0;
  std::FILE* file = limit == 0 ? std::fopen("/proc/sys/vm/max_map_count", "r") : nullptr;
  if (file != nullptr) {
    unsigned long value = 0;
    if (std::fscanf(file, "%lu", &value) == 1) limit = value;
    std::fclose(file);
  }
  if (std::FILE* file = std::fopen("/proc/self/maps", "r")) {
    for (int c; (c = std::fgetc(file)) != EOF;) in_use += c == '\n';
    std::fclose(file);
  }
  return {limit, in_use};
}

int create_memfd(std::size_t capacity, std::size_t page_bytes, bool& hugetlb) {
#if defined(MFD_HUGETLB)
  // Huge pages only where the pool holds the whole capacity: a hugetlb mapping the pool
  // cannot back fails at map time, after the arena promised the bytes.
  if (free_huge_pages(page_bytes) * page_bytes >= capacity) {
    const int fd = memfd_create("latte-arena", MFD_CLOEXEC | MFD_HUGETLB);
    if (fd >= 0 && ftruncate(fd, static_cast<off_t>(capacity)) == 0) {
      hugetlb = true;
      return fd;
    }
    if (fd >= 0) close(fd);
  }
#endif
  hugetlb = false;
  const int fd = memfd_create("latte-arena", MFD_CLOEXEC);
  if (fd < 0) throw bad_alloc("paged arena: " + system_error("memfd_create"));
  if (ftruncate(fd, static_cast<off_t>(capacity)) != 0) {
    const std::string reason = system_error("ftruncate");
    close(fd);
    throw bad_alloc("paged arena: " + reason);
  }
  return fd;
}

}  // namespace

HostPages::HostPages(std::size_t capacity, HostPagesOptions options)
    : page_bytes_(options.page_bytes), prefault_(options.prefault), idle_share_(options.idle_share) {
  const auto system_page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  LATTE_EXPECTS(page_bytes_ >= system_page && (page_bytes_ & (page_bytes_ - 1)) == 0,
                "page_bytes must be a power of two of at least the system page (" + std::to_string(system_page) +
                    " bytes), got " + std::to_string(page_bytes_));
  const detail::PageSpan pages = detail::page_span(capacity, page_bytes_, options.virtual_factor);
  physical_pages_ = pages.physical_pages;
  virtual_pages_ = pages.virtual_pages;
  const std::size_t physical = physical_pages_, virtual_pages = virtual_pages_;
  // Counted before this arena's own range is reserved: `needed` holds that mapping.
  const auto [limit, in_use] = mapping_limit(options.mapping_limit);
  fd_ = create_memfd(physical * page_bytes_, page_bytes_, hugetlb_);
  // Reserved, inaccessible, aligned to a page so every mapped page lands on its own boundary.
  const std::size_t span = virtual_pages * page_bytes_;
  void* reserved = mmap(nullptr, span + page_bytes_, PROT_NONE, kReserve, -1, 0);
  if (reserved == MAP_FAILED) {
    const std::string reason = system_error("mmap (reserving the virtual range)");
    close(fd_);
    throw bad_alloc("paged arena: " + reason);
  }
  auto* start = static_cast<std::byte*>(reserved);
  const std::size_t misalignment = reinterpret_cast<std::uintptr_t>(start) % page_bytes_;
  const std::size_t head = misalignment ? page_bytes_ - misalignment : 0;
  if (head) munmap(start, head);
  if (page_bytes_ - head) munmap(start + head + span, page_bytes_ - head);
  base_ = start + head;
  // At worst every mapped page is a mapping of its own between reserved ones: past the
  // system's limit a map would fail with the capacity free, so the arena is refused up front.
  const std::size_t needed = 2 * physical + 1;
  std::lock_guard<std::mutex> lock(promises_mutex);
  if (limit != 0 && in_use + promised_mappings + needed > limit) {
    munmap(base_, span);
    close(fd_);
    throw bad_alloc("paged arena: " + std::to_string(physical) + " pages of " + std::to_string(page_bytes_) +
                    " bytes may need up to " + std::to_string(needed) + " mappings, and vm.max_map_count is " +
                    std::to_string(limit) + " with " + std::to_string(in_use) + " in use and " +
                    std::to_string(promised_mappings) + " promised to the process's other paged arenas; "
                    "raise page_bytes or vm.max_map_count");
  }
  promised_mappings += needed;
  promised_ = needed;
}

HostPages::~HostPages() {
  munmap(base_, static_cast<std::size_t>(virtual_pages_) * page_bytes_);
  close(fd_);
  std::lock_guard<std::mutex> lock(promises_mutex);
  promised_mappings -= promised_;
}

bool HostPages::map(std::uint32_t first, std::uint32_t physical, std::uint32_t count) noexcept {
  std::byte* at = base_ + static_cast<std::size_t>(first) * page_bytes_;
  const std::size_t length = static_cast<std::size_t>(count) * page_bytes_;
  const int flags = MAP_SHARED | MAP_FIXED | (prefault_ ? MAP_POPULATE : 0);
  void* mapped = mmap(at, length, PROT_READ | PROT_WRITE, flags, fd_, static_cast<off_t>(physical) * page_bytes_);
  if (mapped == MAP_FAILED) {
    unmap(first, count);  // a failed MAP_FIXED may have dropped the reservation there
    return false;
  }
  // A shared mapping would be shared with a forked child too: the child gets none instead.
  madvise(at, length, MADV_DONTFORK);
  return true;
}

bool HostPages::unmap(std::uint32_t first, std::uint32_t count) noexcept {
  // A fresh inaccessible mapping replaces the pages in one call and keeps the range reserved.
  // (munmap would leave a hole another mmap of the process could land in.)
  return mmap(base_ + static_cast<std::size_t>(first) * page_bytes_, static_cast<std::size_t>(count) * page_bytes_,
              PROT_NONE, kReserve | MAP_FIXED, -1, 0) != MAP_FAILED;
}

void HostPages::discard(std::uint32_t physical, std::uint32_t count) noexcept {
  fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(physical) * page_bytes_,
            static_cast<off_t>(count) * page_bytes_);
}

}  // namespace latte::memory
