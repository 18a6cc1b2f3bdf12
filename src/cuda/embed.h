// Embedding lookup on the GPU, for one token (a decode step) or many (a prompt chunk, a
// multi-sequence step), reading the weights' device layout (DevMat, cuda/dev_mat.h). CPU twin:
// cpu::embed, row by row.
#pragma once

#include "cuda/dev_mat.h"
#include "cuda/launch.h"

namespace smolrt::cuda {

// x[i*ldx + c] = dequant(row tokens[i] of emb)[c] * scale for i < n, c < emb.cols; columns
// [cols, ldx) are left untouched. emb: any format of qformat.h. tokens: device [n]; an id outside
// [0, emb.rows) writes a NaN row instead of reading out of bounds (the backends check ids on the
// host first). Bit-identical to cpu::embed. scale: ModelConfig::embed_scale (gemma3: sqrt(dim)).
void embed(const DevMat& emb, const int* tokens, int n, float* x, int ldx, const Launch& s,
           float scale = 1.f);

// Throws an Error naming `who` unless emb is a matrix embed takes: a format of qformat.h,
// non-empty, with its meta bytes and whole blocks per row.
void check_embedding(const char* who, const DevMat& emb);

}  // namespace smolrt::cuda
