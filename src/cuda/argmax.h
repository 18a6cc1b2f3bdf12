// Two-stage GPU argmax: stage 1 (kArgmaxBlocks blocks) reduces grid-strided slices to (value,
// index) partials; stage 2 (one block) reduces the partials to one int in device memory.
// Rules (same as cpu::argmax): the largest value wins; ties -> the lowest index; NaN never wins
// (NaN entries are ignored; +inf wins, -inf is an ordinary value); all-NaN -> 0.
#pragma once

#include <cuda_runtime.h>

namespace smolrt::cuda {

constexpr int kArgmaxBlocks = 264;  // 2 per SM on a 132-SM Hopper

// x: [n] f32; part_v: [kArgmaxBlocks] f32, part_i: [kArgmaxBlocks] int (scratch); out: 1 int.
void argmax(const float* x, int n, float* part_v, int* part_i, int* out, cudaStream_t s);

}  // namespace smolrt::cuda
