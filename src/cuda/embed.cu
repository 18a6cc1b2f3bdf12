// Embedding lookup: one thread per output element; a single row, so launch latency dominates.
#include "cuda/embed.h"

#include "core/error.h"
#include "cuda/device_common.cuh"
#include "cuda/launch.h"

namespace smolrt::cuda {
namespace {

__global__ void embed_kernel(const DevMat m, const int* token, float* out) {
  pdl_wait();
  pdl_trigger();
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= m.cols) return;
  out[c] = dequant_at(m, (size_t)*token, c);
}

}  // namespace

void check_embedding(const char* who, const DevMat& emb) {
  if (emb.type != GgmlType::F32 && emb.type != GgmlType::F16 && emb.type != GgmlType::Q4_0 &&
      emb.type != GgmlType::Q8_0) {
    fail(who, ": no CUDA embedding kernel for type ", type_name(emb.type),
         "; supported: f32, f16, q4_0, q8_0");
  }
  if (emb.q == nullptr || emb.cols <= 0 || emb.rows <= 0) fail(who, ": null or empty matrix");
  if (emb.type != GgmlType::F32 && emb.type != GgmlType::F16 &&
      (emb.d == nullptr || emb.cols % 32 != 0)) {
    fail(who, ": quantized matrix without scales or cols=", emb.cols, " not a multiple of 32");
  }
}

void embed(const DevMat& emb, const int* token, float* out, cudaStream_t s) {
  check_embedding("embed", emb);
  if (token == nullptr || out == nullptr) fail("embed: null pointer");
  launch_kernel(embed_kernel, dim3((emb.cols + 255) / 256), dim3(256), 0, s, emb, token, out);
}

}  // namespace smolrt::cuda
