// Replays one serving trace on BuddyArena (with and without its rounding reducers), on a
// model of PyTorch's caching allocator, and on glibc malloc (measuring RSS); prints JSON.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "caching_allocator_model.hpp"
#include "latte/error.hpp"
#include "latte/memory/buddy_arena.hpp"
#include "latte/memory/host_pages.hpp"
#include "latte/memory/host_resource.hpp"
#include "latte/memory/statistics_adaptor.hpp"
#include "serving_trace.hpp"

using namespace latte;
using bench::TraceOp;

namespace {

constexpr std::size_t kSampleEvery = 10'000;
// The paged arena's page (the third argument, bytes): a failure with live + request + one
// page within the capacity had room, whatever the allocator.
std::uint64_t kPage = 1u << 20;

struct ReplayResult {
  std::uint64_t peak_live = 0, peak_reserved = 0;
  std::uint64_t failures = 0, failures_below_80 = 0, failures_with_a_page_to_spare = 0;
  double ext_frag_mean = 0, ext_frag_max = 0, ext_frag_mean_busy = 0;
  double seconds = 0;
  std::vector<double> ext_frag_samples;
  std::uint64_t map_calls = 0, unmap_calls = 0;  // a paged arena's
};

// Fragmentation samples are taken only while at least 5% of the capacity is free: with
// almost nothing free the ratio says little.
template <typename Alloc, typename Free, typename Usage>
ReplayResult replay(const std::vector<TraceOp>& ops, std::uint64_t capacity, Alloc alloc, Free release,
                    Usage usage) {
  ReplayResult r;
  std::vector<std::uint64_t> size_of;
  std::vector<char> failed;
  std::uint64_t live = 0;
  double frag_sum = 0, busy_sum = 0;
  std::size_t busy_samples = 0;
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const TraceOp& op = ops[i];
    if (op.id >= size_of.size()) {
      size_of.resize(op.id + 1024, 0);
      failed.resize(op.id + 1024, 0);
    }
    if (op.bytes) {
      if (alloc(op.id, op.bytes)) {
        size_of[op.id] = op.bytes;
        live += op.bytes;
        r.peak_live = std::max(r.peak_live, live);
      } else {
        failed[op.id] = 1;
        ++r.failures;
        // The arena's fragmentation_failures, counted the same way for every allocator replayed.
        if (double(live + op.bytes) <= latte::memory::kFragmentationFailureShare * double(capacity)) ++r.failures_below_80;
        if (live + op.bytes + kPage <= capacity) ++r.failures_with_a_page_to_spare;
      }
    } else if (!failed[op.id]) {
      release(op.id);
      live -= size_of[op.id];
    }
    auto [reserved, free_bytes, largest] = usage();
    r.peak_reserved = std::max(r.peak_reserved, reserved);
    if (i % kSampleEvery == 0 && free_bytes >= capacity / 20) {
      const double frag = 1.0 - double(largest) / double(free_bytes);
      r.ext_frag_samples.push_back(frag);
      frag_sum += frag;
      r.ext_frag_max = std::max(r.ext_frag_max, frag);
      if (live >= capacity / 2) {
        busy_sum += frag;
        ++busy_samples;
      }
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.ext_frag_mean = r.ext_frag_samples.empty() ? 0 : frag_sum / double(r.ext_frag_samples.size());
  r.ext_frag_mean_busy = busy_samples ? busy_sum / double(busy_samples) : 0;
  return r;
}

ReplayResult replay_on(const std::vector<TraceOp>& ops, memory::BuddyArena& arena) {
  std::vector<void*> ptr_of;
  return replay(
      ops, arena.capacity(),
      [&](std::uint32_t id, std::uint64_t bytes) {
        if (id >= ptr_of.size()) ptr_of.resize(id + 1024, nullptr);
        try {
          ptr_of[id] = arena.allocate(bytes);
          return true;
        } catch (const latte::out_of_memory&) {
          return false;
        }
      },
      [&](std::uint32_t id) { arena.deallocate(ptr_of[id], 0); },
      [&] {
        const memory::ArenaUsage u = arena.usage();
        return std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>{u.reserved, u.free, u.largest_free};
      });
}

ReplayResult replay_arena(const std::vector<TraceOp>& ops, std::uint64_t capacity,
                          memory::ArenaOptions options) {
  // The arena never touches the memory it manages, so the region need not be faulted in.
  memory::HostResource host(memory::HostResourceOptions{false, false});
  memory::BuddyArena arena(host, capacity, options);
  return replay_on(ops, arena);
}

// Paged: the buddy carves addresses four times the capacity and pages of a memfd (1 MiB) are
// mapped under the blocks (not written, so not faulted in: the replay counts, it does not touch).
ReplayResult replay_paged(const std::vector<TraceOp>& ops, std::uint64_t capacity) {
  memory::BuddyArena arena(std::make_unique<memory::HostPages>(capacity, memory::HostPagesOptions{kPage, 4, false}));
  ReplayResult r = replay_on(ops, arena);
  r.map_calls = arena.usage().map_calls;
  r.unmap_calls = arena.usage().unmap_calls;
  return r;
}

ReplayResult replay_caching_model(const std::vector<TraceOp>& ops, std::uint64_t capacity) {
  bench::CachingAllocatorModel model(capacity);
  std::vector<bench::CachingAllocatorModel::Block*> block_of;
  std::size_t step = 0;
  return replay(
      ops, capacity,
      [&](std::uint32_t id, std::uint64_t bytes) {
        if (id >= block_of.size()) block_of.resize(id + 1024, nullptr);
        block_of[id] = model.allocate(bytes);
        return block_of[id] != nullptr;
      },
      [&](std::uint32_t id) { model.free(block_of[id]); },
      [&] {
        // Free-space walk is O(cached blocks): only at sampling points.
        const bool sample = step++ % kSampleEvery == 0;
        return std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>{
            model.reserved(), sample ? model.free_bytes() : 0, sample ? model.largest_free() : 0};
      });
}

std::uint64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::uint64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
}

// glibc in a child process so its heap starts clean and the RSS is the trace's alone.
// Every page of every allocation is touched, as a real user of the buffer would.
struct MallocResult {
  std::uint64_t peak_rss = 0;
  double seconds = 0;
};

MallocResult replay_glibc(const std::vector<TraceOp>& ops) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    std::vector<void*> ptr_of;
    const std::uint64_t baseline = resident_bytes();
    MallocResult r;
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const TraceOp& op = ops[i];
      if (op.id >= ptr_of.size()) ptr_of.resize(op.id + 1024, nullptr);
      if (op.bytes) {
        auto* p = static_cast<char*>(std::malloc(op.bytes));
        for (std::uint64_t off = 0; off < op.bytes; off += 4096) p[off] = 1;
        ptr_of[op.id] = p;
      } else {
        std::free(ptr_of[op.id]);
      }
      if (i % 1000 == 0) r.peak_rss = std::max(r.peak_rss, resident_bytes() - baseline);
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (write(fds[1], &r, sizeof r) != sizeof r) _exit(1);
    _exit(0);
  }
  close(fds[1]);
  MallocResult r;
  if (read(fds[0], &r, sizeof r) != sizeof r) r = {};
  close(fds[0]);
  waitpid(pid, nullptr, 0);
  return r;
}

void print_result(const char* name, const ReplayResult& r, bool last = false) {
  std::printf("  \"%s\": {\"peak_live\": %llu, \"peak_reserved\": %llu, \"failures\": %llu, "
              "\"failures_below_80pct\": %llu, \"failures_with_a_page_to_spare\": %llu, \"ext_frag_mean\": %.4f, "
              "\"ext_frag_max\": %.4f, \"ext_frag_mean_above_half_full\": %.4f, \"ext_frag_samples\": [",
              name, (unsigned long long)r.peak_live, (unsigned long long)r.peak_reserved,
              (unsigned long long)r.failures, (unsigned long long)r.failures_below_80,
              (unsigned long long)r.failures_with_a_page_to_spare, r.ext_frag_mean,
              r.ext_frag_max, r.ext_frag_mean_busy);
  for (std::size_t i = 0; i < r.ext_frag_samples.size(); ++i) {
    std::printf("%s%.3f", i ? ", " : "", r.ext_frag_samples[i]);
  }
  std::printf("], \"map_calls\": %llu, \"unmap_calls\": %llu, \"seconds\": %.3f}%s\n",
              (unsigned long long)r.map_calls, (unsigned long long)r.unmap_calls, r.seconds, last ? "" : ",");
}

}  // namespace

int main(int argc, char** argv) {
  bench::ServingTraceConfig cfg;
  if (argc > 1) cfg.min_ops = std::strtoull(argv[1], nullptr, 10);
  if (argc > 2) cfg.seed = std::strtoull(argv[2], nullptr, 10);
  if (argc > 3) kPage = std::strtoull(argv[3], nullptr, 10);
  const std::vector<TraceOp> ops = bench::make_serving_trace(cfg);
  const std::uint64_t peak_live = bench::peak_live_bytes(ops);
  // Capacity puts the trace's peak at 85% of the arena: failures below 80% are the arena's fault.
  const std::uint64_t capacity = (peak_live * 100 / 85 + (1 << 20) - 1) >> 20 << 20;
  std::printf("{\n  \"ops\": %zu, \"seed\": %llu, \"trace_peak_live\": %llu, \"capacity\": %llu, \"page_bytes\": %llu,\n",
              ops.size(), (unsigned long long)cfg.seed, (unsigned long long)peak_live,
              (unsigned long long)capacity, (unsigned long long)kPage);
  print_result("buddy_arena", replay_arena(ops, capacity, memory::ArenaOptions{}));
  // A power-of-two capacity lets the whole arena coalesce into one block; same trace.
  std::uint64_t pow2 = 1;
  while (pow2 < capacity) pow2 <<= 1;
  std::printf("  \"pow2_capacity\": %llu,\n", (unsigned long long)pow2);
  print_result("buddy_arena_pow2_capacity", replay_arena(ops, pow2, memory::ArenaOptions{}));
  print_result("binary_buddy_no_trim", replay_arena(ops, capacity, memory::ArenaOptions{256, true, false}));
  print_result("paged_arena", replay_paged(ops, capacity));
  print_result("caching_allocator_model", replay_caching_model(ops, capacity));
  const MallocResult m = replay_glibc(ops);
  std::printf("  \"glibc_malloc\": {\"peak_rss\": %llu, \"seconds\": %.3f}\n}\n",
              (unsigned long long)m.peak_rss, m.seconds);
  return 0;
}
