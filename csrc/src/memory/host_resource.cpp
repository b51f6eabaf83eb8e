#include "latte/memory/host_resource.hpp"

#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "latte/error.hpp"

namespace latte::memory {
namespace {

// The few cudart entry points we need, resolved once; all null when no runtime is present.
struct CudaRuntime {
  using HostRegister = int (*)(void*, std::size_t, unsigned);
  using HostUnregister = int (*)(void*);
  using GetDeviceCount = int (*)(int*);
  HostRegister host_register = nullptr;
  HostUnregister host_unregister = nullptr;
  bool has_device = false;

  CudaRuntime() {
    void* lib = nullptr;
    for (const char* name : {"libcudart.so", "libcudart.so.13", "libcudart.so.12"}) {
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib) break;
    }
    if (!lib) return;
    auto count_fn = reinterpret_cast<GetDeviceCount>(dlsym(lib, "cudaGetDeviceCount"));
    host_register = reinterpret_cast<HostRegister>(dlsym(lib, "cudaHostRegister"));
    host_unregister = reinterpret_cast<HostUnregister>(dlsym(lib, "cudaHostUnregister"));
    int devices = 0;
    has_device = count_fn && host_register && host_unregister && count_fn(&devices) == 0 && devices > 0;
  }

  static const CudaRuntime& get() {
    static const CudaRuntime runtime;
    return runtime;
  }
};

constexpr unsigned kCudaHostRegisterPortable = 1;  // pinned for every CUDA context

std::size_t page_rounded(std::size_t bytes) {
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

}  // namespace

bool HostResource::cuda_runtime_available() { return CudaRuntime::get().has_device; }

HostResource::~HostResource() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [ptr, pinned] : pinned_) {
    if (pinned) CudaRuntime::get().host_unregister(ptr);
  }
}

void* HostResource::do_allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  const std::size_t length = page_rounded(bytes);
  const int flags = MAP_PRIVATE | MAP_ANONYMOUS | (options_.prefault ? MAP_POPULATE : 0);
  void* ptr = mmap(nullptr, length, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (ptr == MAP_FAILED) {
    throw out_of_memory("HostResource: mmap of " + std::to_string(length) +
                        " bytes failed: " + std::strerror(errno));
  }
#ifdef MADV_HUGEPAGE
  // Large arenas are hot and long-lived: fewer TLB misses are worth the bigger pages.
  madvise(ptr, length, MADV_HUGEPAGE);
#endif
  bool pinned = false;
  const CudaRuntime& cuda = CudaRuntime::get();
  if (options_.pin && cuda.has_device) {
    pinned = cuda.host_register(ptr, length, kCudaHostRegisterPortable) == 0;
  }
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    pinned_[ptr] = pinned;
  } catch (...) {
    if (pinned) cuda.host_unregister(ptr);
    munmap(ptr, length);
    throw;
  }
  return ptr;
}

void HostResource::do_deallocate(void* ptr, std::size_t bytes) noexcept {
  if (ptr == nullptr) return;
  bool pinned = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = pinned_.find(ptr);
    if (it == pinned_.end()) return;  // not ours: unmapping it would be worse than leaking
    pinned = it->second;
    pinned_.erase(it);
  }
  if (pinned) CudaRuntime::get().host_unregister(ptr);
  munmap(ptr, page_rounded(bytes));
}

bool HostResource::is_pinned(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = pinned_.find(const_cast<void*>(ptr));
  return it != pinned_.end() && it->second;
}

}  // namespace latte::memory
