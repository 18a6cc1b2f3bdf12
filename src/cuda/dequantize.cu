#include "cuda/dequantize.h"

#include <cuda_fp16.h>

#include "core/cuda_check.h"
#include "core/error.h"
#include "cuda/device_common.cuh"

namespace smolrt::cuda {
namespace {

// One thread per output element: a one-time pass at load, bound by the writes.
__global__ void dequantize_kernel(const DevMat m, __half* out, int ldo) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)m.rows * m.cols) return;
  const size_t r = i / m.cols;
  const int c = (int)(i % m.cols);
  out[r * ldo + c] = __float2half_rn(dequant_at(m, r, c));
}

}  // namespace

void dequantize(const DevMat& m, uint16_t* out, int ldo, const Launch& s) {
  if (!m.q || !out || m.rows <= 0 || m.cols <= 0 || ldo < m.cols)
    fail("dequantize: bad arguments rows=", m.rows, " cols=", m.cols, " ldo=", ldo);
  if (dev_layout(m.type).qk == 0) fail("dequantize: no device layout for type ", type_name(m.type));
  const size_t n = (size_t)m.rows * m.cols;
  constexpr int kThreads = 256;
  dequantize_kernel<<<(unsigned)((n + kThreads - 1) / kThreads), kThreads, 0, s.stream>>>(
      m, reinterpret_cast<__half*>(out), ldo);
  CUDA_CHECK_LAUNCH();
}

}  // namespace smolrt::cuda
