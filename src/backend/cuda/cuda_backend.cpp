// make_cuda_backend: one sequence of the multi-sequence engine (cuda_batch.cpp).
#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include "backend/single_sequence.h"

namespace smolrt {

bool cuda_device_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
}

std::unique_ptr<Backend> make_cuda_backend_ex(const Model& m, const BatchOptions& opt,
                                              const CudaOptions& copt) {
  return make_single_sequence(make_cuda_batch_backend_ex(m, opt, copt));
}

std::unique_ptr<Backend> make_cuda_backend(const Model& m, const BackendOptions& opt) {
  return make_cuda_backend_ex(m, single_sequence_options(opt), CudaOptions{});
}

}  // namespace smolrt
