// Embedding lookup: one thread per output element; a single row, so launch latency dominates.
#include "cuda/embed.h"

#include "core/error.h"
#include "cuda/device_common.cuh"
#include "cuda/launch.h"

namespace smolrt::cuda {
namespace {

__global__ void embed_kernel(const DevMat m, const int* token, float* out, float scale) {
  pdl_wait();
  pdl_trigger();
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= m.cols) return;
  out[c] = dequant_at(m, (size_t)*token, c) * scale;
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

void embed(const DevMat& emb, const int* token, float* out, const Launch& s, float scale) {
  check_embedding("embed", emb);
  if (token == nullptr || out == nullptr) fail("embed: null pointer");
  launch_kernel(embed_kernel, dim3((emb.cols + 255) / 256), dim3(256), 0, s, emb, token, out,
                scale);
}

}  // namespace smolrt::cuda
