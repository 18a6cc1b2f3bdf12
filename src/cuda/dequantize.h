// A weight matrix in any device format (cuda/dev_mat.h) dequantized to fp16: the dense copy the
// large-batch GEMMs (dense_gemm.h) read. Each weight is the format's exact value rounded once to
// fp16 (a relative 2^-11 at most; Q4_0/Q8_0 values of an fp16 scale are mostly exact).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/dev_mat.h"
#include "cuda/launch.h"

namespace smolrt::cuda {

// out[r * ldo + c] = fp16(W[r][c]) for r < m.rows, c < m.cols (ldo >= m.cols).
void dequantize(const DevMat& m, uint16_t* out, int ldo, const Launch& stream);

}  // namespace smolrt::cuda
