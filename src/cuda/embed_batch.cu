// Batched embedding lookup (see embed_batch.h): one block per token, the row's columns strided
// over the block's threads (coalesced quant-byte reads within a row).
#include "cuda/embed_batch.h"

#include <cmath>

#include "core/error.h"
#include "cuda/device_common.cuh"
#include "cuda/embed.h"
#include "cuda/launch.h"

namespace smolrt::cuda {
namespace {

__global__ void embed_batch_kernel(const DevMat m, const int* tokens, float* x, int ldx,
                                   float scale) {
  pdl_wait();  // x may still be read by the previous kernel (e.g. the previous chunk's lm_head)
  pdl_trigger();
  const int i = blockIdx.x, tok = tokens[i];
  const bool ok = tok >= 0 && tok < m.rows;
  const size_t r = ok ? (size_t)tok : 0;
  for (int c = threadIdx.x; c < m.cols; c += blockDim.x) {
    x[(size_t)i * ldx + c] = ok ? dequant_at(m, r, c) * scale : NAN;
  }
}

}  // namespace

void embed_batch(const DevMat& emb, const int* tokens, int n, float* x, int ldx, const Launch& s,
                 float scale) {
  check_embedding("embed_batch", emb);
  if (tokens == nullptr || x == nullptr || n <= 0 || ldx < emb.cols) {
    fail("embed_batch: null pointer or bad shape (n=", n, ", ldx=", ldx, ", cols=", emb.cols, ")");
  }
  launch_kernel(embed_batch_kernel, dim3(n), dim3(256), 0, s, emb, tokens, x, ldx, scale);
}

}  // namespace smolrt::cuda
