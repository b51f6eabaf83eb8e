#include "latte/memory/cuda_device_resource.hpp"

#include <cuda_runtime_api.h>

#include <string>

#include "latte/error.hpp"

namespace latte::memory {
namespace {

// Allocations may come from threads that never selected a device: select it for the call.
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

}  // namespace

CudaDeviceResource::CudaDeviceResource(int device) : device_(device) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  LATTE_EXPECTS(status == cudaSuccess, std::string("no usable CUDA runtime/driver: ") + cudaGetErrorString(status));
  LATTE_EXPECTS(device >= 0 && device < count,
                "CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(count) + " present)");
}

void* CudaDeviceResource::do_allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  ScopedDevice scope(device_);
  void* ptr = nullptr;
  const cudaError_t status = cudaMalloc(&ptr, bytes);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state so later calls are unaffected
    throw out_of_memory("CudaDeviceResource: cudaMalloc of " + std::to_string(bytes) + " bytes on device " +
                        std::to_string(device_) + " failed: " + cudaGetErrorString(status));
  }
  return ptr;
}

void CudaDeviceResource::do_deallocate(void* ptr, std::size_t) noexcept {
  if (ptr == nullptr) return;
  ScopedDevice scope(device_);
  cudaFree(ptr);
}

}  // namespace latte::memory
