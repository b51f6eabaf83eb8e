#include "latte/memory/device_pages.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <string>

#include "latte/error.hpp"

namespace latte::memory {

struct DevicePages::Driver {
  CUresult (*device_get)(CUdevice*, int) = nullptr;
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

// Driver calls act on the thread's current context: the device's primary one, as the runtime sets it.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) cudaSetDevice(device);
  }
  ~ScopedDevice() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }

 private:
  int previous_ = -1;
};

template <typename Function>
void resolve(const char* symbol, Function& function, std::string& missing) {
  void* found = nullptr;
  cudaDriverEntryPointQueryResult result = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(symbol, &found, 12000, cudaEnableDefault, &result) != cudaSuccess ||
      result != cudaDriverEntryPointSuccess || found == nullptr) {
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
    : driver_(nullptr), device_(device) {
  LATTE_EXPECTS(options.virtual_factor >= 2, "virtual_factor must be at least 2");
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
  ScopedDevice scope(device);
  cudaFree(nullptr);  // the primary context, current on this thread, for the driver's calls
  CUdevice handle = 0;
  int supported = 0;
  if (d.device_get(&handle, device) != CUDA_SUCCESS ||
      d.device_attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, handle) != CUDA_SUCCESS ||
      !supported) {
    throw bad_alloc("paged device arena: CUDA device " + std::to_string(device) +
                    " does not support virtual memory management");
  }
  const CUmemAllocationProp prop = page_properties(device);
  std::size_t granularity = 0;
  if (d.get_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS ||
      granularity == 0) {
    throw bad_alloc("paged device arena: cuMemGetAllocationGranularity failed on device " + std::to_string(device));
  }
  page_bytes_ = (options.page_bytes + granularity - 1) / granularity * granularity;
  LATTE_EXPECTS((page_bytes_ & (page_bytes_ - 1)) == 0,
                "page_bytes must round up to a power of two of the device's granularity (" +
                    std::to_string(granularity) + " bytes), got " + std::to_string(options.page_bytes));
  LATTE_EXPECTS(capacity >= page_bytes_, "capacity must hold at least one page (" + std::to_string(page_bytes_) +
                                             " bytes on this device), got " + std::to_string(capacity));
  const std::size_t physical = capacity / page_bytes_, virtual_pages = physical * options.virtual_factor;
  LATTE_EXPECTS(virtual_pages < 0xFFFFFFFFu, "too many pages: raise page_bytes");
  physical_pages_ = static_cast<std::uint32_t>(physical);
  virtual_pages_ = static_cast<std::uint32_t>(virtual_pages);
  CUdeviceptr reserved = 0;
  if (d.reserve(&reserved, virtual_pages * page_bytes_, page_bytes_, 0, 0) != CUDA_SUCCESS) {
    throw bad_alloc("paged device arena: cuMemAddressReserve of " + std::to_string(virtual_pages * page_bytes_) +
                    " bytes failed on device " + std::to_string(device));
  }
  base_ = reinterpret_cast<std::byte*>(reserved);
  handles_.assign(physical, 0);
  mapped_.assign(virtual_pages, 0);
}

DevicePages::~DevicePages() {
  ScopedDevice scope(device_);
  for (std::uint32_t page = 0; page < virtual_pages_; ++page) {
    if (mapped_[page]) unmap_page(page);
  }
  for (auto& handle : handles_) {
    if (handle) driver_->release(handle);
  }
  driver_->free_range(address(base_), static_cast<std::size_t>(virtual_pages_) * page_bytes_);
}

bool DevicePages::unmap_page(std::uint32_t page) noexcept {
  if (driver_->unmap(address(base_ + static_cast<std::size_t>(page) * page_bytes_), page_bytes_) != CUDA_SUCCESS) {
    return false;
  }
  mapped_[page] = 0;
  return true;
}

bool DevicePages::map(std::uint32_t first, std::uint32_t physical, std::uint32_t count) noexcept {
  ScopedDevice scope(device_);
  const CUmemAllocationProp prop = page_properties(device_);
  std::uint32_t done = 0, created_from = count;
  bool ok = true;
  for (; done < count && ok; ++done) {
    auto& handle = handles_[physical + done];
    if (handle == 0) {
      if (driver_->create(&handle, page_bytes_, &prop, 0) != CUDA_SUCCESS) {
        handle = 0;
        ok = false;
        break;
      }
      if (created_from == count) created_from = done;
    }
    const std::uint32_t page = first + done;
    ok = driver_->map(address(base_ + static_cast<std::size_t>(page) * page_bytes_), page_bytes_, 0, handle, 0) ==
         CUDA_SUCCESS;
    if (ok) mapped_[page] = physical + done + 1;
  }
  if (ok) {
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device_;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    ok = driver_->set_access(address(base_ + static_cast<std::size_t>(first) * page_bytes_),
                             static_cast<std::size_t>(count) * page_bytes_, &access, 1) == CUDA_SUCCESS;
  }
  if (!ok) {  // the range as it was: unmapped, and the memory this call created given back
    for (std::uint32_t page = first; page < first + count; ++page) {
      if (mapped_[page]) unmap_page(page);
    }
    for (std::uint32_t i = created_from; i < count; ++i) {
      auto& handle = handles_[physical + i];
      if (handle && !mapped_[first + i] && driver_->release(handle) == CUDA_SUCCESS) handle = 0;
    }
  }
  return ok;
}

bool DevicePages::unmap(std::uint32_t first, std::uint32_t count) noexcept {
  ScopedDevice scope(device_);
  bool ok = true;
  for (std::uint32_t page = first; page < first + count; ++page) {
    if (mapped_[page]) ok = unmap_page(page) && ok;
  }
  return ok;
}

void DevicePages::discard(std::uint32_t physical, std::uint32_t count) noexcept {
  ScopedDevice scope(device_);
  for (std::uint32_t p = physical; p < physical + count; ++p) {
    if (handles_[p] && driver_->release(handles_[p]) == CUDA_SUCCESS) handles_[p] = 0;
  }
}

}  // namespace latte::memory
