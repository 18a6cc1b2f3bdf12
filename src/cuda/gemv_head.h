// Wide matrix-vector kernel for lm_head-sized Q8_0 matrices (used by gemv.cu; not a public API).
//
// The generic decode matvec gives each lane whole 32-column blocks, so at cols = 576 only 18 of
// 32 lanes load, and too few weight bytes per SM are in flight to use the DRAM bandwidth on a
// large lm_head. Here a warp takes groups of kHeadRows consecutive rows, which are one
// contiguous run of 16-byte quant vectors in the split layout (dev_mat.h): every lane loads,
// fully coalesced, and the next group's loads are in flight while the current one is reduced.
// Per row: partial dots of 16 columns each (x staged once per block in padded shared memory),
// summed in a fixed order (deterministic), then the gemv_argmax epilogue (argmax_block.cuh).
#pragma once

#include <cuda_runtime.h>

#include "cuda/gemv.h"
#include "cuda/launch.h"

namespace smolrt::cuda {

constexpr int kHeadMaxCols = 1024;
constexpr int kHeadMinRows = 8192;

// Whether w goes through the wide kernel: Q8_0 with cols a multiple of 32 up to kHeadMaxCols and
// at least kHeadMinRows rows. Both gemv (accumulate=false, no residual) and gemv_argmax route such
// matrices here, so the logits of the two are bit-identical.
bool head_kernel_takes(const DevMat& w);

// The wide kernel's dot products run on DP4A against x quantized per 32-column block to two int8
// levels (x = s * (hi + lo / 254)), each element within max|x| / 64516 of its block.

// Its grid for max_blocks (0 = the default: all blocks resident at once) = the number of argmax
// partials it writes.
int head_grid(const DevMat& w, int max_blocks);

struct HeadArgs {
  DevMat w;
  const float* x;       // [w.cols]
  const float* norm_w;  // [w.cols] fused RMSNorm weight, or nullptr
  float eps;
  float* out;     // [w.rows]
  float* part_v;  // argmax partials [grid] (nullptr: no argmax)
  int* part_i;
};

// Launches the kernel; returns its grid size.
int head_gemv(const HeadArgs& a, int max_blocks, const Launch& s);

}  // namespace smolrt::cuda
