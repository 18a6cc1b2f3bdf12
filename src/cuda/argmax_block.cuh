// Device pieces of the GPU argmax (argmax.cu, prefill_ops.cu) and of the argmax fused into the
// lm_head matvecs (gemv.cu, gemv_head.cu): the candidate order, the block reduction and stage 2.
#pragma once

#include <climits>

#include "cuda/argmax.h"
#include "cuda/gemv.h"

namespace smolrt::cuda {

// Argmax candidate order (argmax.h): does (av, ai) beat (bv, bi)? Candidates never hold NaN.
__device__ __forceinline__ bool amax_beats(float av, int ai, float bv, int bi) {
  if (ai == INT_MAX) return false;
  if (bi == INT_MAX) return true;
  return av > bv || (av == bv && ai < bi);
}

// This thread's best non-NaN candidate among x[k], k = first, first + stride, ... < n (kept in
// (v, i) when none beats it).
__device__ __forceinline__ void amax_scan(const float* x, int first, int n, int stride, float& v,
                                          int& i) {
  for (int k = first; k < n; k += stride) {
    const float xv = x[k];
    if (!isnan(xv) && amax_beats(xv, k, v, i)) v = xv, i = k;
  }
}

// Block-wide best of every thread's candidate (v, i) in the amax_beats order: warp shuffles, then
// the warps' winners through the caller's shared scratch sv/si (NT/32 entries each). Every thread
// of the NT-thread block calls it; the block's best lands in thread 0 only, which alone reads the
// scratch after the barrier (the other threads may go on and reuse shared memory: racecheck
// reported them reading the scratch while thread 0 had moved on to the next shared write).
template <int NT>
__device__ __forceinline__ void block_argmax(float& v, int& i, float* sv, int* si) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (amax_beats(ov, oi, v, i)) v = ov, i = oi;
  }
  if ((threadIdx.x & 31) == 0) {
    sv[threadIdx.x >> 5] = v;
    si[threadIdx.x >> 5] = i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
#pragma unroll
    for (int k = 1; k < NT / 32; ++k) {
      if (amax_beats(sv[k], si[k], v, i)) v = sv[k], i = si[k];
    }
  }
}

// Argmax stage 2 over n partials (written by earlier kernels or by other blocks of this grid:
// read from L2) in a fixed order, by one NT-thread block; thread 0 stores the id (0 when every
// partial is empty) into *out and, when given, hands it to the next decode step (StepHandoff: the
// id into its token slot, its bumped fields advanced by one) and stores it in pinned host memory.
// Called by the step's last kernel only, so every kernel that read the position has completed.
template <int NT>
__device__ __forceinline__ void argmax_stage2(const float* part_v, const int* part_i, int n,
                                              int* out, const StepHandoff& next, int* host_out,
                                              float* sv, int* si) {
  float v = 0.f;
  int i = INT_MAX;
  for (int k = threadIdx.x; k < n; k += NT) {
    const float pv = __ldcg(part_v + k);
    const int pi = __ldcg(part_i + k);
    if (amax_beats(pv, pi, v, i)) v = pv, i = pi;
  }
  block_argmax<NT>(v, i, sv, si);
  if (threadIdx.x == 0) {
    const int id = i == INT_MAX ? 0 : i;
    *out = id;
    if (next.token != nullptr) *next.token = id;
    for (unsigned b = next.bump; b != 0; b &= b - 1) next.fields[__ffs(b) - 1] += 1;
    if (host_out != nullptr) *reinterpret_cast<volatile int*>(host_out) = id;
  }
}

}  // namespace smolrt::cuda
