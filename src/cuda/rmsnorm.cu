// RMSNorm: one block of 256 threads; n is a few hundred, so one block is all the work there is.
#include "cuda/rmsnorm.h"

#include "core/error.h"
#include "cuda/device_common.cuh"
#include "cuda/launch.h"

namespace smolrt::cuda {
namespace {

// 1 / sqrt(mean(v[0..n)^2) + eps), for every thread of a 256-thread block.
__device__ float block_rms_scale(const float* v, int n, float eps) {
  __shared__ float partial[8];
  float ss = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss += v[i] * v[i];
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int k = 0; k < 8; ++k) total += partial[k];
  return rsqrtf(total / (float)n + eps);
}

__global__ void __launch_bounds__(256)
    rmsnorm_kernel(float* out, const float* x, const float* w, int n, float eps) {
  pdl_wait();
  pdl_trigger();
  const float scale = block_rms_scale(x, n, eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = x[i] * scale * w[i];
}

// x[row] += rmsnorm(y[row]) * w: one block per row.
__global__ void __launch_bounds__(256)
    rmsnorm_add_kernel(float* x, int ldx, const float* y, int ldy, const float* w, int n,
                       float eps) {
  pdl_wait();
  pdl_trigger();
  const float* yr = y + (size_t)blockIdx.x * ldy;
  float* xr = x + (size_t)blockIdx.x * ldx;
  const float scale = block_rms_scale(yr, n, eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) xr[i] += yr[i] * scale * w[i];
}

}  // namespace

void rmsnorm_add(float* x, int ldx, const float* y, int ldy, const float* w, int n, int rows,
                 float eps, const Launch& s) {
  if (!x || !y || !w || n <= 0 || rows <= 0 || ldx < n || ldy < n)
    fail("rmsnorm_add: null pointer or bad shape (n ", n, ", rows ", rows, ")");
  launch_kernel(rmsnorm_add_kernel, dim3(rows), dim3(256), 0, s, x, ldx, y, ldy, w, n, eps);
}

void rmsnorm(float* out, const float* x, const float* w, int n, float eps, const Launch& s) {
  if (out == nullptr || x == nullptr || w == nullptr || n <= 0) {
    fail("rmsnorm: null pointer or n=", n);
  }
  launch_kernel(rmsnorm_kernel, dim3(1), dim3(256), 0, s, out, x, w, n, eps);
}

}  // namespace smolrt::cuda
