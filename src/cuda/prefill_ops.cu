// argmax_rows (see prefill_ops.h).
#include "cuda/prefill_ops.h"

#include <cmath>

#include "core/cuda_check.h"
#include "core/error.h"
#include "cuda/launch.cuh"

namespace smolrt::cuda {
namespace {

// (value, index) is better than (bv, bi): larger, or equal with a lower index; NaN never wins.
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
  if (isnan(v)) return false;
  if (isnan(bv)) return true;
  return v > bv || (v == bv && i < bi);
}

__global__ void __launch_bounds__(1024)
    argmax_rows_kernel(const float* logits, int ld, int n, int* out) {
  detail::pdl_wait();  // logits come from the lm_head GEMM
  detail::pdl_trigger();
  const float* row = logits + (size_t)blockIdx.x * ld;
  float bv = NAN;
  int bi = 0x7fffffff;
  for (int c = threadIdx.x; c < n; c += blockDim.x) {
    const float v = row[c];
    if (better(v, c, bv, bi)) bv = v, bi = c;
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
    if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  __shared__ float sv[32];
  __shared__ int si[32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) sv[warp] = bv, si[warp] = bi;
  __syncthreads();
  if (warp == 0) {
    const int nw = blockDim.x >> 5;
    bv = lane < nw ? sv[lane] : NAN;
    bi = lane < nw ? si[lane] : 0x7fffffff;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
      if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    if (lane == 0) out[blockIdx.x] = isnan(bv) ? 0 : bi;
  }
}

}  // namespace

void argmax_rows(const float* logits, int ld, int n_cols, int n_rows, int* out, cudaStream_t s) {
  if (n_rows <= 0 || n_cols <= 0 || ld < n_cols || !logits || !out)
    fail("argmax_rows: bad arguments rows=", n_rows, " cols=", n_cols);
  detail::launch_pdl(argmax_rows_kernel, dim3(n_rows), dim3(1024), s, logits, ld, n_cols, out);
}

}  // namespace smolrt::cuda
