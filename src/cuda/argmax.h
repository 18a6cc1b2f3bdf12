// Two-stage GPU argmax: stage 1 (kArgmaxBlocks blocks) reduces grid-strided slices to (value,
// index) partials; stage 2 (one block) reduces the partials to one int in device memory.
// Rules (same as cpu::argmax): the largest value wins; ties -> the lowest index; NaN never wins
// (NaN entries are ignored; +inf wins, -inf is an ordinary value); all-NaN -> 0.
#pragma once

#include <cuda_runtime.h>

#include "cuda/launch.h"

namespace smolrt::cuda {

constexpr int kArgmaxBlocks = 264;  // 2 per SM on a 132-SM Hopper

// Optional decode-step hand-off to the next step, whose inputs are device slots: stage 2 writes
// the id into *token and adds 1 to fields[i] for every bit i of bump (its position and whatever
// moves with it), so the next step needs no H2D copy.
struct StepHandoff {
  int* token = nullptr;
  int* fields = nullptr;
  unsigned bump = 0;
};

// x: [n] f32; part_v: [kArgmaxBlocks] f32, part_i: [kArgmaxBlocks] int (scratch); out: 1 int.
// next: the hand-off above (none by default); host_out: pinned (UVA-mapped) host int or nullptr;
// stage 2 also stores the id there, so the host reads it after a stream sync without a D2H copy.
void argmax(const float* x, int n, float* part_v, int* part_i, int* out, const Launch& s,
            const StepHandoff& next = {}, int* host_out = nullptr);

// Stage 2 alone over n_parts partials made elsewhere (the lm_head matvec's fused stage 1,
// gemv.h); n_parts <= kArgmaxMaxParts. Same outputs as argmax().
constexpr int kArgmaxMaxParts = 2048;
void argmax_final(const float* part_v, const int* part_i, int n_parts, int* out, const Launch& s,
                  const StepHandoff& next = {}, int* host_out = nullptr);

}  // namespace smolrt::cuda
