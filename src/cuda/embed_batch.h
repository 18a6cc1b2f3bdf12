// Embedding lookup for a batch of tokens, reading the decode backend's weight layout (DevMat,
// cuda/dev_mat.h), so the batched prefill needs no second copy of token_embd.
#pragma once

#include <cuda_runtime.h>

#include "cuda/dev_mat.h"
#include "cuda/launch.h"

namespace smolrt::cuda {

// x[i*ldx + c] = dequant(row tokens[i] of emb)[c] for i < n, c < emb.cols; columns [cols, ldx)
// are left untouched. emb: F32, F16, Q4_0 or Q8_0 (split layout). tokens: device [n]; an id
// outside [0, emb.rows) writes a NaN row instead of reading out of bounds (the backend checks
// ids on the host first). Bit-identical to cpu::embed row by row.
// scale: ModelConfig::embed_scale, applied to every element.
void embed_batch(const DevMat& emb, const int* tokens, int n, float* x, int ldx, const Launch& s,
                 float scale = 1.f);

}  // namespace smolrt::cuda
