// Two-stage GPU argmax: stage 1 (kArgmaxBlocks blocks) reduces grid-strided slices to (value,
// index) partials; stage 2 (one block) reduces the partials to one int in device memory.
// Rules (same as cpu::argmax): the largest value wins; ties -> the lowest index; NaN never wins
// (NaN entries are ignored; +inf wins, -inf is an ordinary value); all-NaN -> 0.
#pragma once

#include <cuda_runtime.h>

#include "cuda/launch.h"

namespace smolrt::cuda {

constexpr int kArgmaxBlocks = 264;  // 2 per SM on a 132-SM Hopper

// x: [n] f32; part_v: [kArgmaxBlocks] f32, part_i: [kArgmaxBlocks] int (scratch); out: 1 int.
// Optional decode-step hand-off (both may be nullptr):
//   next_params: [2] device {token, pos} slots the next decode step reads; stage 2 writes the id
//     into next_params[0] and increments next_params[1], so the next step needs no H2D copy.
//   host_out: pinned (UVA-mapped) host int; stage 2 also stores the id there, so the host reads it
//     after a stream sync without a D2H copy.
void argmax(const float* x, int n, float* part_v, int* part_i, int* out, const Launch& s,
            int* next_params = nullptr, int* host_out = nullptr);

// Stage 2 alone over n_parts partials made elsewhere (the lm_head matvec's fused stage 1,
// gemv.h); n_parts <= kArgmaxMaxParts. Same outputs as argmax().
constexpr int kArgmaxMaxParts = 2048;
void argmax_final(const float* part_v, const int* part_i, int n_parts, int* out, const Launch& s,
                  int* next_params = nullptr, int* host_out = nullptr);

}  // namespace smolrt::cuda
