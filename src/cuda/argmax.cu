// Two-stage argmax (see argmax.h). Index INT_MAX marks "no candidate yet" (empty or all NaN).
#include "cuda/argmax.h"

#include <climits>

#include "core/error.h"
#include "cuda/argmax_block.cuh"
#include "cuda/device_common.cuh"
#include "cuda/launch.h"

namespace smolrt::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    argmax_stage1_kernel(const float* x, int n, float* part_v, int* part_i) {
  pdl_wait();
  pdl_trigger();
  float v = 0.f;
  int i = INT_MAX;
  for (int k = blockIdx.x * kThreads + threadIdx.x; k < n; k += gridDim.x * kThreads) {
    const float xv = x[k];
    if (!isnan(xv) && amax_beats(xv, k, v, i)) {
      v = xv;
      i = k;
    }
  }
  __shared__ float sv[kThreads / 32];
  __shared__ int si[kThreads / 32];
  block_argmax<kThreads>(v, i, sv, si);
  if (threadIdx.x == 0) {
    part_v[blockIdx.x] = v;
    part_i[blockIdx.x] = i;
  }
}

__global__ void __launch_bounds__(kThreads)
    argmax_stage2_kernel(const float* part_v, const int* part_i, int n_parts, int* out,
                         int* next_params, int* host_out) {
  pdl_wait();
  pdl_trigger();
  float v = 0.f;
  int i = INT_MAX;
  for (int k = threadIdx.x; k < n_parts; k += kThreads) {
    if (amax_beats(part_v[k], part_i[k], v, i)) {
      v = part_v[k];
      i = part_i[k];
    }
  }
  __shared__ float sv[kThreads / 32];
  __shared__ int si[kThreads / 32];
  block_argmax<kThreads>(v, i, sv, si);
  if (threadIdx.x == 0) {
    const int id = i == INT_MAX ? 0 : i;
    *out = id;
    // Last kernel of the step: every earlier kernel has completed (pdl_wait above), so the
    // position slot they read may advance now.
    if (next_params != nullptr) {
      next_params[0] = id;
      next_params[1] += 1;
    }
    if (host_out != nullptr) *reinterpret_cast<volatile int*>(host_out) = id;
  }
}

}  // namespace

void argmax(const float* x, int n, float* part_v, int* part_i, int* out, cudaStream_t s,
            int* next_params, int* host_out) {
  if (!x || !part_v || !part_i || !out || n <= 0) fail("argmax: null pointer or n=", n);
  int blocks = (n + kThreads - 1) / kThreads;
  if (blocks > kArgmaxBlocks) blocks = kArgmaxBlocks;
  launch_kernel(argmax_stage1_kernel, dim3(blocks), dim3(kThreads), 0, s, x, n, part_v, part_i);
  launch_kernel(argmax_stage2_kernel, dim3(1), dim3(kThreads), 0, s, part_v, part_i, blocks, out,
                next_params, host_out);
}

void argmax_final(const float* part_v, const int* part_i, int n_parts, int* out, cudaStream_t s,
                  int* next_params, int* host_out) {
  if (!part_v || !part_i || !out || n_parts <= 0 || n_parts > kArgmaxMaxParts) {
    fail("argmax_final: null pointer or n_parts=", n_parts, " (1..", kArgmaxMaxParts, ")");
  }
  launch_kernel(argmax_stage2_kernel, dim3(1), dim3(kThreads), 0, s, part_v, part_i, n_parts, out,
                next_params, host_out);
}

}  // namespace smolrt::cuda
