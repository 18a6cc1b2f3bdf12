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
  amax_scan(x, blockIdx.x * kThreads + threadIdx.x, n, gridDim.x * kThreads, v, i);
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
                         StepHandoff next, int* host_out) {
  pdl_wait();
  pdl_trigger();
  __shared__ float sv[kThreads / 32];
  __shared__ int si[kThreads / 32];
  argmax_stage2<kThreads>(part_v, part_i, n_parts, out, next, host_out, sv, si);
}

}  // namespace

void argmax(const float* x, int n, float* part_v, int* part_i, int* out, const Launch& s,
            const StepHandoff& next, int* host_out) {
  if (!x || !part_v || !part_i || !out || n <= 0) fail("argmax: null pointer or n=", n);
  int blocks = (n + kThreads - 1) / kThreads;
  if (blocks > kArgmaxBlocks) blocks = kArgmaxBlocks;
  launch_kernel(argmax_stage1_kernel, dim3(blocks), dim3(kThreads), 0, s, x, n, part_v, part_i);
  launch_kernel(argmax_stage2_kernel, dim3(1), dim3(kThreads), 0, s, part_v, part_i, blocks, out,
                next, host_out);
}

void argmax_final(const float* part_v, const int* part_i, int n_parts, int* out, const Launch& s,
                  const StepHandoff& next, int* host_out) {
  if (!part_v || !part_i || !out || n_parts <= 0 || n_parts > kArgmaxMaxParts) {
    fail("argmax_final: null pointer or n_parts=", n_parts, " (1..", kArgmaxMaxParts, ")");
  }
  launch_kernel(argmax_stage2_kernel, dim3(1), dim3(kThreads), 0, s, part_v, part_i, n_parts, out,
                next, host_out);
}

}  // namespace smolrt::cuda
