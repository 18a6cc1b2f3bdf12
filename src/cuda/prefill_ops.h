// Whole-batch row operations of the prefill and multi-sequence paths: argmax over every logits
// row of a chunk in one launch, and the gather of the rows that need logits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/launch.h"

namespace smolrt::cuda {

// out[i] = argmax of logits[i*ld + 0 .. n_cols): ties -> lowest index, NaN never wins
// (an all-NaN row -> 0). A cluster of blocks per row; n_rows <= 65535.
void argmax_rows(const float* logits, int ld, int n_cols, int n_rows, int* out,
                 const Launch& stream);

// out[i][0..cols) = x[idx[i]][0..cols) for i < m (rows of a step that need logits). One block
// per row; ld and cols multiples of 4, 16-byte aligned rows.
void gather_rows(const float* x, int ld, const int* idx, int m, int cols, float* out,
                 const Launch& stream);

// out[i][j] = act(g) * u for the fp16 output of the dense gate/up GEMM, gu[i] = [gate | up]
// (hid columns each, pitch ldgu): out [n][ldo] fp16 row-major, the down GEMM's input. act as
// ModelConfig::act (0 SiLU, 1 GELU-tanh), computed in fp32. hid, ldgu, ldo multiples of 8.
void gated_act(const uint16_t* gu, int ldgu, int n, int hid, int act, uint16_t* out, int ldo,
               const Launch& stream);

// Structured output: for each of `rows` logits rows (pitch ld) whose mask_idx[r] >= 0, tokens
// whose bit is clear in masks[mask_idx[r]] (a bitset over the vocabulary, `words` words) get -inf.
// The CPU twin: cpu::mask_logits.
void mask_logits(float* logits, int ld, int vocab, int rows, const int* mask_idx,
                 const uint32_t* masks, int words, const Launch& stream);

}  // namespace smolrt::cuda
