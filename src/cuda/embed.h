// Embedding row lookup on the GPU: out[0..cols) = dequant(row *token of the embedding matrix).
#pragma once

#include <cuda_runtime.h>

#include "cuda/dev_mat.h"

namespace smolrt::cuda {

// emb: F32, F16, Q4_0 or Q8_0 (split layout); token: device pointer to the token id (must be in
// [0, emb.rows): the backend checks it on the host before writing it); out: [emb.cols] f32.
void embed(const DevMat& emb, const int* token, float* out, cudaStream_t s);

// Throws an Error naming `who` unless emb is a matrix the embedding kernels (embed, embed_batch)
// take: F32, F16, Q4_0 or Q8_0, non-empty, with scales and cols a multiple of 32 when quantized.
void check_embedding(const char* who, const DevMat& emb);

}  // namespace smolrt::cuda
