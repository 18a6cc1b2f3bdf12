// Small whole-batch ops of the prefill path: one launch each over all tokens of a chunk.
#pragma once

#include <cuda_runtime.h>

#include "quant/formats.h"

namespace smolrt::cuda {

// x[i*ldx + c] = dequant(table row tokens[i])[c], c < dim, i < n. table: device, raw GGUF rows
// (F32, F16, BF16, Q4_0 or Q8_0), vocab rows of dim. tokens: device [n], already validated by the
// caller (a token outside [0, vocab) writes a NaN row instead of reading out of bounds).
void embed_rows(const void* table, GgmlType type, int vocab, int dim, const int* tokens, int n,
                float* x, int ldx, cudaStream_t stream);

// out[i] = argmax of logits[i*ld + 0 .. n_cols): ties -> lowest index, NaN never wins
// (an all-NaN row -> 0). One block per row.
void argmax_rows(const float* logits, int ld, int n_cols, int n_rows, int* out,
                 cudaStream_t stream);

}  // namespace smolrt::cuda
