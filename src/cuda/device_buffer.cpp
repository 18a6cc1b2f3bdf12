#include "cuda/device_buffer.h"

#include "core/error.h"

namespace smolrt::cuda {

void fail_alloc(cudaError_t err, size_t bytes, const std::string& what) {
  (void)cudaGetLastError();  // clear the sticky-free allocation error
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  const double mib = 1.0 / (1024.0 * 1024.0);
  if (err == cudaErrorMemoryAllocation) {
    fail("GPU out of memory: allocating ", bytes * mib, " MiB for ", what, " failed (",
         free_b * mib, " MiB free of ", total_b * mib,
         " MiB); use a smaller --ctx, a smaller model, or free the GPU");
  }
  fail("CUDA error allocating ", bytes * mib, " MiB for ", what, ": ", cudaGetErrorName(err), " (",
       cudaGetErrorString(err), ")");
}

DeviceBuffer::DeviceBuffer(size_t bytes, const std::string& what) : n_(bytes) {
  cudaError_t e = cudaMalloc(&p_, bytes);
  if (e != cudaSuccess) {
    p_ = nullptr;
    fail_alloc(e, bytes, what);
  }
}

DeviceBuffer::~DeviceBuffer() {
  if (p_) cudaFree(p_);
}

PinnedBuffer::PinnedBuffer(size_t bytes, const std::string& what) : n_(bytes) {
  cudaError_t e = cudaMallocHost(&p_, bytes);
  if (e != cudaSuccess) {
    p_ = nullptr;
    fail_alloc(e, bytes, what + " (pinned host memory)");
  }
}

PinnedBuffer::~PinnedBuffer() {
  if (p_) cudaFreeHost(p_);
}

}  // namespace smolrt::cuda
