// Embedding row lookup on the GPU: out[0..cols) = dequant(row *token of the embedding matrix).
#pragma once

#include <cuda_runtime.h>

#include "cuda/dev_mat.h"
#include "cuda/launch.h"

namespace smolrt::cuda {

// emb: any format of qformat.h, in its device layout; token: device pointer to the token id (must
// be in [0, emb.rows): the backend checks it on the host before writing it); out: [emb.cols] f32.
// scale: ModelConfig::embed_scale (gemma3: sqrt(dim)), applied to every element.
void embed(const DevMat& emb, const int* token, float* out, const Launch& s, float scale = 1.f);

// Throws an Error naming `who` unless emb is a matrix the embedding kernels (embed, embed_batch)
// take: a format of qformat.h, non-empty, with its meta bytes and whole blocks per row.
void check_embedding(const char* who, const DevMat& emb);

}  // namespace smolrt::cuda
