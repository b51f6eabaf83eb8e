#include "latte/memory/device_pages.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <string>

#include "latte/error.hpp"

namespace latte::memory {

struct DevicePages::Driver {
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*retain_primary)(CUcontext*, CUdevice) = nullptr;
  CUresult (*release_primary)(CUdevice) = nullptr;
  CUresult (*push)(CUcontext) = nullptr;
  CUresult (*pop)(CUcontext*) = nullptr;
  CUresult (*synchronize)() = nullptr;
  CUresult (*device_attribute)(int*, CUdevice_attribute, CUdevice) = nullptr;
  CUresult (*get_granularity)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) = nullptr;
  CUresult (*reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*free_range)(CUdeviceptr, size_t) = nullptr;
  CUresult (*create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long) = nullptr;
  CUresult (*release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) = nullptr;
  CUresult (*unmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  std::string missing;  // why the entry points cannot be had ("" when they can)
};

namespace {

// Driver calls act on the thread's current context: the device's primary one is pushed for a
// call and popped after, so the thread's own device and context are left as they were (setting
// the runtime's device back would create a context on a device the thread never used).
class ScopedContext {
 public:
  ScopedContext(const DevicePages::Driver& driver, void* context) : driver_(driver) {
    pushed_ = driver.push(static_cast<CUcontext>(context)) == CUDA_SUCCESS;
  }
  ~ScopedContext() {
    CUcontext popped = nullptr;
    if (pushed_) driver_.pop(&popped);
  }

 private:
  const DevicePages::Driver& driver_;
  bool pushed_ = false;
};

template <typename Function>
void resolve(const char* symbol, Function& function, std::string& missing) {
  void* found = nullptr;
  cudaDriverEntryPointQueryResult result = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  const cudaError_t status = cudaGetDriverEntryPointByVersion(symbol, &found, 12000, cudaEnableDefault, &result);
#else
  const cudaError_t status = cudaGetDriverEntryPoint(symbol, &found, cudaEnableDefault, &result);
#endif
  if (status != cudaSuccess || result != cudaDriverEntryPointSuccess || found == nullptr) {
    cudaGetLastError();
    if (missing.empty()) missing = std::string("the CUDA driver has no ") + symbol;
    return;
  }
  function = reinterpret_cast<Function>(found);
}

const DevicePages::Driver& driver() {
  static const DevicePages::Driver entry_points = [] {
    DevicePages::Driver d;
    resolve("cuDeviceGet", d.device_get, d.missing);
    resolve("cuDevicePrimaryCtxRetain", d.retain_primary, d.missing);
    resolve("cuDevicePrimaryCtxRelease", d.release_primary, d.missing);
    resolve("cuCtxPushCurrent", d.push, d.missing);
    resolve("cuCtxPopCurrent", d.pop, d.missing);
    resolve("cuCtxSynchronize", d.synchronize, d.missing);
    resolve("cuDeviceGetAttribute", d.device_attribute, d.missing);
    resolve("cuMemGetAllocationGranularity", d.get_granularity, d.missing);
    resolve("cuMemAddressReserve", d.reserve, d.missing);
    resolve("cuMemAddressFree", d.free_range, d.missing);
    resolve("cuMemCreate", d.create, d.missing);
    resolve("cuMemRelease", d.release, d.missing);
    resolve("cuMemMap", d.map, d.missing);
    resolve("cuMemUnmap", d.unmap, d.missing);
    resolve("cuMemSetAccess", d.set_access, d.missing);
    return d;
  }();
  return entry_points;
}

CUmemAllocationProp page_properties(int device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

CUdeviceptr address(const std::byte* at) { return reinterpret_cast<CUdeviceptr>(at); }

}  // namespace

DevicePages::DevicePages(std::size_t capacity, int device, DevicePagesOptions options)
    : driver_(nullptr), device_(device), idle_share_(options.idle_share) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw bad_alloc(std::string("paged device arena: no usable CUDA driver or device: ") +
                    cudaGetErrorString(status));
  }
  LATTE_EXPECTS(device >= 0 && device < count,
                "CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(count) + " present)");
  const Driver& d = driver();
  if (!d.missing.empty()) throw bad_alloc("paged device arena: " + d.missing);
  driver_ = &d;
  CUdevice handle = 0;
  int supported = 0;
  CUcontext context = nullptr;
  if (d.device_get(&handle, device) != CUDA_SUCCESS ||
      d.device_attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, handle) != CUDA_SUCCESS ||
      !supported) {
    throw bad_alloc("paged device arena: CUDA device " + std::to_string(device) +
                    " does not support virtual memory management");
  }
  if (d.retain_primary(&context, handle) != CUDA_SUCCESS) {
    throw bad_alloc("paged device arena: cannot retain CUDA device " + std::to_string(device) + "'s primary context");
  }
  context_ = context;
  try {
    ScopedContext scope(d, context_);
    const CUmemAllocationProp prop = page_properties(device);
    std::size_t granularity = 0;
    if (d.get_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS ||
        granularity == 0) {
      throw bad_alloc("paged device arena: cuMemGetAllocationGranularity failed on device " +
                      std::to_string(device));
    }
    page_bytes_ = (options.page_bytes + granularity - 1) / granularity * granularity;
    LATTE_EXPECTS((page_bytes_ & (page_bytes_ - 1)) == 0,
                  "page_bytes must round up to a power of two of the device's granularity (" +
                      std::to_string(granularity) + " bytes), got " + std::to_string(options.page_bytes));
    const detail::PageSpan pages = detail::page_span(capacity, page_bytes_, options.virtual_factor);
    physical_pages_ = pages.physical_pages;
    virtual_pages_ = pages.virtual_pages;
    const std::size_t physical = physical_pages_, virtual_pages = virtual_pages_;
    // The bookkeeping before the range: nothing to give back if it cannot be had.
    handles_.assign(physical, 0);
    created_.assign(physical, 0);
    mapped_.assign(virtual_pages, 0);
    CUdeviceptr reserved = 0;
    if (d.reserve(&reserved, virtual_pages * page_bytes_, page_bytes_, 0, 0) != CUDA_SUCCESS) {
      throw bad_alloc("paged device arena: cuMemAddressReserve of " + std::to_string(virtual_pages * page_bytes_) +
                      " bytes failed on device " + std::to_string(device));
    }
    base_ = reinterpret_cast<std::byte*>(reserved);
  } catch (...) {
    d.release_primary(handle);
    throw;
  }
}

DevicePages::~DevicePages() {
  {
    ScopedContext scope(*driver_, context_);
    driver_->synchronize();  // kernels may still read the pages: unmapping does not wait for them
    for (std::uint32_t page = 0; page < virtual_pages_; ++page) {
      if (mapped_[page]) unmap_page(page);
    }
    for (auto& handle : handles_) {
      if (handle) driver_->release(handle);
    }
    driver_->free_range(address(base_), static_cast<std::size_t>(virtual_pages_) * page_bytes_);
  }
  CUdevice handle = 0;
  if (driver_->device_get(&handle, device_) == CUDA_SUCCESS) driver_->release_primary(handle);
}

bool DevicePages::unmap_page(std::uint32_t page) noexcept {
  if (driver_->unmap(address(base_ + static_cast<std::size_t>(page) * page_bytes_), page_bytes_) != CUDA_SUCCESS) {
    return false;
  }
  mapped_[page] = 0;
  return true;
}

bool DevicePages::map(std::uint32_t first, std::uint32_t physical, std::uint32_t count) noexcept {
  ScopedContext scope(*driver_, context_);
  const CUmemAllocationProp prop = page_properties(device_);
  bool ok = true;
  for (std::uint32_t i = 0; i < count && ok; ++i) {
    auto& handle = handles_[physical + i];
    if (handle == 0) {
      if (driver_->create(&handle, page_bytes_, &prop, 0) != CUDA_SUCCESS) {
        handle = 0;
        ok = false;
        break;
      }
      created_[physical + i] = 1;
    }
    const std::uint32_t page = first + i;
    ok = driver_->map(address(base_ + static_cast<std::size_t>(page) * page_bytes_), page_bytes_, 0, handle, 0) ==
         CUDA_SUCCESS;
    if (ok) mapped_[page] = physical + i + 1;
  }
  if (ok) {
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device_;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    ok = driver_->set_access(address(base_ + static_cast<std::size_t>(first) * page_bytes_),
                             static_cast<std::size_t>(count) * page_bytes_, &access, 1) == CUDA_SUCCESS;
  }
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::uint32_t page = first + i;
    auto& handle = handles_[physical + i];
    if (!ok && mapped_[page] && !unmap_page(page)) {
      // Still mapped here: its memory is left where it is, and the physical page gets new
      // memory when next mapped, so no memory is ever under two addresses.
      handle = 0;
    } else if (!ok && created_[physical + i] && handle && driver_->release(handle) == CUDA_SUCCESS) {
      handle = 0;  // made by this call: given back, as the range is left as it was
    }
    created_[physical + i] = 0;
  }
  return ok;
}

bool DevicePages::unmap(std::uint32_t first, std::uint32_t count) noexcept {
  ScopedContext scope(*driver_, context_);
  // Kernels may still read the pages, and unmapping does not wait for them: without the wait
  // (a faulted context, a stream being captured) the pages stay mapped.
  if (driver_->synchronize() != CUDA_SUCCESS) return false;
  bool ok = true;
  for (std::uint32_t page = first; page < first + count; ++page) {
    if (mapped_[page]) ok = unmap_page(page) && ok;
  }
  return ok;
}

std::uint32_t DevicePages::unmap_each(const std::uint32_t* pages, std::uint32_t count) noexcept {
  ScopedContext scope(*driver_, context_);
  if (driver_->synchronize() != CUDA_SUCCESS) return 0;  // once for all of them; as in unmap
  std::uint32_t done = 0;
  while (done < count && (!mapped_[pages[done]] || unmap_page(pages[done]))) ++done;
  return done;
}

void DevicePages::discard(std::uint32_t physical, std::uint32_t count) noexcept {
  ScopedContext scope(*driver_, context_);
  for (std::uint32_t p = physical; p < physical + count; ++p) {
    if (handles_[p] && driver_->release(handles_[p]) == CUDA_SUCCESS) handles_[p] = 0;
  }
}

}  // namespace latte::memory
