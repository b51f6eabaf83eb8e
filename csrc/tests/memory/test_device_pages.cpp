// BuddyArena's paged mode on a CUDA device (DevicePages): blocks contiguous in device addresses
// over any free pages of the device, as on the host. Built with the CUDA toolkit; without a
// device the construction's refusal is checked (it names the reason) and the rest is skipped: the
// executable then exits 77, which CTest counts as skipped, not passed. With one, a device that is
// not there is refused in its place.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../check.hpp"
#include "stress_loop.hpp"
#include "latte/error.hpp"
#include "latte/memory/arena_stack.hpp"
#include "latte/memory/buddy_arena.hpp"
#include "latte/memory/device_pages.hpp"

using namespace latte::memory;
using latte::out_of_memory;

namespace {

bool device_present() {
  int count = 0;
  const bool present = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  cudaGetLastError();
  return present;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Fills `bytes` at `at` with `value` on the device and reads back its first and last byte.
bool filled(void* at, std::size_t bytes, int value) {
  if (cudaMemset(at, value, bytes) != cudaSuccess) return false;
  unsigned char first = 0, last = 0;
  auto* p = static_cast<unsigned char*>(at);
  return cudaMemcpy(&first, p, 1, cudaMemcpyDeviceToHost) == cudaSuccess &&
         cudaMemcpy(&last, p + bytes - 1, 1, cudaMemcpyDeviceToHost) == cudaSuccess && first == value &&
         last == value;
}

}  // namespace

TEST_CASE("a paged device arena on a device that is not there is refused with the reason, never a crash") {
  std::string message;
  if (!device_present()) {
    try {
      DevicePages pages(64u << 20, 0);
    } catch (const latte::bad_alloc& e) {
      message = e.what();
    }
    CHECK(contains(message, "paged device arena: no usable CUDA driver or device"));
    return;
  }
  int count = 0;
  cudaGetDeviceCount(&count);
  try {
    DevicePages pages(64u << 20, count);  // one past the last device
  } catch (const latte::logic_error& e) {
    message = e.what();
  }
  CHECK(contains(message, "CUDA device " + std::to_string(count) + " does not exist"));
}

TEST_CASE("half of a checkerboarded device arena is one block, over the device's pages") {
  if (!device_present()) SKIP("no CUDA device: the device pages are not exercised here");
  auto owned = std::make_unique<DevicePages>(32u << 20, 0);
  const std::size_t page = owned->page_bytes();
  const std::uint32_t pages = owned->physical_pages();
  BuddyArena arena(std::move(owned), ArenaOptions{256, false, true});
  std::vector<void*> blocks, kept;
  for (std::uint32_t i = 0; i < pages; ++i) blocks.push_back(arena.allocate(page));
  for (std::uint32_t i = 0; i < pages; ++i) {
    if (i % 2) arena.deallocate(blocks[i], page); else kept.push_back(blocks[i]);
  }
  const std::size_t half = page * (pages / 2);
  void* large = arena.allocate(half);  // no two free pages are neighbours in addresses
  CHECK(filled(large, half, 7));
  for (void* block : kept) CHECK(filled(block, page, 3));
  CHECK(filled(large, half, 7) && filled(kept.front(), page, 3));
  std::string message;
  try {
    arena.allocate(page);
  } catch (const out_of_memory& e) {
    message = e.what();
  }
  CHECK(contains(message, "capacity"));
  arena.deallocate(large, half);
  for (void* block : kept) arena.deallocate(block, page);
  arena.check_invariants();
  CHECK(arena.usage().allocated == 0);
  arena.release_cached();  // idle pages unmapped, their memory released
  arena.check_invariants();
}

TEST_CASE("an ArenaStack asked for paged device memory serves from device pages") {
  if (!device_present()) SKIP("no CUDA device: no device pages to serve from");
  ArenaStackOptions options;
  options.capacity = 64u << 20;
  options.device = Device::cuda;
  options.paged = true;
  ArenaStack stack(options);
  CHECK(stack.fallback_reason().empty());
  CHECK(std::string(stack.arena().page_kind()) == "cuda");
  void* block = stack.resource().allocate(8u << 20);
  CHECK(filled(block, 8u << 20, 5));
  stack.resource().deallocate(block, 8u << 20);
}

int main() { return latte::testing::run_all(); }
