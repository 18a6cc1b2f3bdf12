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
  const size_t r = (size_t)*token;
  float v;
  if (m.type == GgmlType::F32) {
    v = static_cast<const float*>(m.q)[r * m.cols + c];
  } else if (m.type == GgmlType::F16) {
    v = half_bits_to_float(static_cast<const uint16_t*>(m.q)[r * m.cols + c]);
  } else {
    const int nb = m.cols / 32, b = c / 32, j = c % 32;
    const float d = half_bits_to_float(m.d[r * nb + b]);
    const uint8_t* q = static_cast<const uint8_t*>(m.q);
    if (m.type == GgmlType::Q8_0) {
      v = (float)(int8_t)q[(r * nb + b) * 32 + j] * d;
    } else {  // Q4_0: byte j%16, low nibble for j < 16
      const uint8_t byte = q[(r * nb + b) * 16 + (j & 15)];
      v = (float)((int)(j < 16 ? (byte & 15) : (byte >> 4)) - 8) * d;
    }
  }
  out[c] = v;
}

}  // namespace

void embed(const DevMat& emb, const int* token, float* out, cudaStream_t s) {
  if (emb.type != GgmlType::F32 && emb.type != GgmlType::F16 && emb.type != GgmlType::Q4_0 &&
      emb.type != GgmlType::Q8_0) {
    fail("embed: no CUDA embedding kernel for type ", type_name(emb.type),
         "; supported: f32, f16, q4_0, q8_0");
  }
  if (emb.q == nullptr || token == nullptr || out == nullptr || emb.cols <= 0) {
    fail("embed: null pointer or empty matrix");
  }
  launch_kernel(embed_kernel, dim3((emb.cols + 255) / 256), dim3(256), 0, s, emb, token, out);
}

}  // namespace smolrt::cuda
