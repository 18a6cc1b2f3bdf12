// Embedding lookup (see embed.h): one thread per output element, a row of blocks per token, so a
// lone token (a decode step) is spread over several blocks and a row's quant bytes are read
// coalesced.
#include "cuda/embed.h"

#include <cmath>

#include "core/error.h"
#include "cuda/device_common.cuh"

namespace smolrt::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void embed_kernel(const DevMat m, const int* tokens, float* x, int ldx, float scale) {
  // The ids may come from the previous kernel (a decode step's argmax hands its id off), and x may
  // still be read by it.
  pdl_wait();
  pdl_trigger();
  const int i = blockIdx.y, c = blockIdx.x * kThreads + threadIdx.x;
  if (c >= m.cols) return;
  const int tok = tokens[i];
  x[(size_t)i * ldx + c] = tok >= 0 && tok < m.rows ? dequant_at(m, (size_t)tok, c) * scale : NAN;
}

}  // namespace

void check_embedding(const char* who, const DevMat& emb) {
  const DevLayout l = dev_layout(emb.type);
  if (l.qk == 0) {
    fail(who, ": no CUDA embedding kernel for type ", type_name(emb.type),
         "; supported: ", format_names());
  }
  if (emb.q == nullptr || emb.cols <= 0 || emb.rows <= 0) fail(who, ": null or empty matrix");
  if (l.block && (emb.d == nullptr || emb.cols % l.qk != 0)) {
    fail(who, ": ", type_name(emb.type), " matrix without its meta bytes or cols=", emb.cols,
         " not a multiple of ", l.qk);
  }
}

void embed(const DevMat& emb, const int* tokens, int n, float* x, int ldx, const Launch& s,
           float scale) {
  check_embedding("embed", emb);
  if (tokens == nullptr || x == nullptr || n <= 0 || n > 65535 || ldx < emb.cols) {
    fail("embed: null pointer or bad shape (n=", n, ", ldx=", ldx, ", cols=", emb.cols, ")");
  }
  launch_kernel(embed_kernel, dim3((emb.cols + kThreads - 1) / kThreads, n), dim3(kThreads), 0, s,
                emb, tokens, x, ldx, scale);
}

}  // namespace smolrt::cuda
