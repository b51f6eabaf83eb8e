// Seeded multi-threaded stress of a BuddyArena over device memory: threads allocate blocks,
// stamp them on the device, read the stamps back and free. A stamp overwritten by another
// thread means two live blocks overlapped; compute-sanitizer's memcheck sees any access
// outside the cudaMalloc'd region. Without a device it is skipped (exit 77, counted so by CTest).
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "../check.hpp"
#include "stress_loop.hpp"
#include "latte/error.hpp"
#include "latte/memory/buddy_arena.hpp"
#include "latte/memory/cuda_device_resource.hpp"

using namespace latte::memory;
using latte::testing::StressBlock;

namespace {

// The first and last words carry the stamp; the rest of the block is left as it is.
bool write_stamp(const StressBlock& b) {
  const std::uint64_t words[1] = {b.stamp};
  auto* bytes = static_cast<char*>(b.ptr);
  return cudaMemcpy(bytes, words, 8, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemcpy(bytes + b.bytes - 8, words, 8, cudaMemcpyHostToDevice) == cudaSuccess;
}

bool stamp_intact(const StressBlock& b) {
  std::uint64_t first = 0, last = 0;
  const auto* bytes = static_cast<const char*>(b.ptr);
  return cudaMemcpy(&first, bytes, 8, cudaMemcpyDeviceToHost) == cudaSuccess &&
         cudaMemcpy(&last, bytes + b.bytes - 8, 8, cudaMemcpyDeviceToHost) == cudaSuccess &&
         first == b.stamp && last == b.stamp;
}

bool device_present() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

}  // namespace

TEST_CASE("threads hammering one device arena never share a block") {
  if (!device_present()) SKIP("no CUDA device: nothing to stress");
  const unsigned seed = latte::testing::stress_setting("LATTE_STRESS_SEED", 20261125);
  const int ops_per_thread = latte::testing::stress_setting("LATTE_STRESS_OPS", 2000);
  std::printf("device stress seed %u, %d ops per thread\n", seed, ops_per_thread);
  CudaDeviceResource device(0);
  BuddyArena arena(device, 64 * 1024 * 1024);
  // Blocks of 256 B to 2 MiB, mostly under 16 KiB: the mix of a variable-length batch.
  const latte::testing::StressShape shape{48, 256, 64, 8192};
  std::atomic<int> copy_errors{0};
  const auto stamp = [&](const StressBlock& b) {
    if (!write_stamp(b)) copy_errors.fetch_add(1);
  };
  const auto counts = latte::testing::stress_threads(arena, 4, seed, 1, ops_per_thread, shape, stamp, stamp_intact,
                                                     [] { cudaSetDevice(0); });  // the current device is per thread
  CHECK(copy_errors.load() == 0);
  CHECK(counts.corrupted == 0);
  arena.check_invariants();
  CHECK(arena.usage().allocated == 0);
  std::printf("out-of-memory refusals: %d\n", counts.refusals);
}

int main() { return latte::testing::run_all(); }
