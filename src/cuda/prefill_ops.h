// Whole-batch argmax of the prefill path: one launch over all logits rows of a chunk.
#pragma once

#include <cuda_runtime.h>

namespace smolrt::cuda {

// out[i] = argmax of logits[i*ld + 0 .. n_cols): ties -> lowest index, NaN never wins
// (an all-NaN row -> 0). One block per row.
void argmax_rows(const float* logits, int ld, int n_cols, int n_rows, int* out,
                 cudaStream_t stream);

}  // namespace smolrt::cuda
