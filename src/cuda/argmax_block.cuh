// Device pieces of the GPU argmax (argmax.cu, prefill_ops.cu) and of the argmax fused into the
// lm_head matvecs (gemv.cu, gemv_head.cu): the candidate order, the block reduction and stage 2
// done by the grid's last block.
#pragma once

#include <climits>

#include "cuda/gemv.h"

namespace smolrt::cuda {

// Argmax candidate order (argmax.h): does (av, ai) beat (bv, bi)? Candidates never hold NaN.
__device__ __forceinline__ bool amax_beats(float av, int ai, float bv, int bi) {
  if (ai == INT_MAX) return false;
  if (bi == INT_MAX) return true;
  return av > bv || (av == bv && ai < bi);
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

// Argmax stage 2 inside the lm_head kernel (saves the launch of a separate kernel): each block
// takes a ticket after publishing its partial; the last one reduces all partials in a fixed order
// (deterministic) and resets the counter for the next launch. sv/si: the block's shared scratch
// of NT/32 entries. Every thread of the block calls it, after the block's partial is written.
template <int NT>
__device__ __forceinline__ void argmax_last_block(const ArgmaxFinal& fin, const float* part_v,
                                                  const int* part_i, float* sv, int* si) {
  __shared__ int is_last;
  if (threadIdx.x == 0) {
    __threadfence();  // our partial is visible before our ticket
    is_last = atomicAdd(fin.count, 1) == (int)gridDim.x - 1;
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  float v = 0.f;
  int i = INT_MAX;
  for (int k = threadIdx.x; k < (int)gridDim.x; k += NT) {
    const float pv = __ldcg(part_v + k);  // L2: written by other blocks
    const int pi = __ldcg(part_i + k);
    if (amax_beats(pv, pi, v, i)) v = pv, i = pi;
  }
  block_argmax<NT>(v, i, sv, si);
  if (threadIdx.x == 0) {
    const int id = i == INT_MAX ? 0 : i;
    *fin.out = id;
    // The lm_head is the step's last kernel: every earlier kernel has completed, so the position
    // slot they read may advance.
    if (fin.next_params != nullptr) {
      fin.next_params[0] = id;
      fin.next_params[1] += 1;
    }
    if (fin.host_out != nullptr) *reinterpret_cast<volatile int*>(fin.host_out) = id;
    *fin.count = 0;
  }
}

}  // namespace smolrt::cuda
