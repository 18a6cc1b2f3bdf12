// Batched embedding lookup (see embed_batch.h): one block per token, the row's columns strided
// over the block's threads (coalesced quant-byte reads within a row).
#include "cuda/embed_batch.h"

#include <cmath>

#include "core/error.h"
#include "cuda/device_common.cuh"
#include "cuda/launch.h"

namespace smolrt::cuda {
namespace {

__global__ void embed_batch_kernel(const DevMat m, const int* tokens, float* x, int ldx) {
  pdl_wait();  // x may still be read by the previous kernel (e.g. the previous chunk's lm_head)
  pdl_trigger();
  const int i = blockIdx.x, tok = tokens[i];
  const bool ok = tok >= 0 && tok < m.rows;
  const size_t r = ok ? (size_t)tok : 0;
  const int nb = m.cols / 32;
  const uint8_t* q = static_cast<const uint8_t*>(m.q);
  for (int c = threadIdx.x; c < m.cols; c += blockDim.x) {
    float v;
    if (m.type == GgmlType::F32) {
      v = static_cast<const float*>(m.q)[r * m.cols + c];
    } else if (m.type == GgmlType::F16) {
      v = half_bits_to_float(static_cast<const uint16_t*>(m.q)[r * m.cols + c]);
    } else {
      const int b = c / 32, j = c % 32;
      const float d = half_bits_to_float(m.d[r * nb + b]);
      if (m.type == GgmlType::Q8_0) {
        v = (float)(int8_t)q[(r * nb + b) * 32 + j] * d;
      } else {  // Q4_0: byte j%16 of the block, low nibble for j < 16
        const uint8_t byte = q[(r * nb + b) * 16 + (j & 15)];
        v = (float)((int)(j < 16 ? (byte & 15) : (byte >> 4)) - 8) * d;
      }
    }
    x[(size_t)i * ldx + c] = ok ? v : NAN;
  }
}

}  // namespace

void embed_batch(const DevMat& emb, const int* tokens, int n, float* x, int ldx, cudaStream_t s) {
  if (emb.type != GgmlType::F32 && emb.type != GgmlType::F16 && emb.type != GgmlType::Q4_0 &&
      emb.type != GgmlType::Q8_0) {
    fail("embed_batch: no CUDA embedding kernel for type ", type_name(emb.type),
         "; supported: f32, f16, q4_0, q8_0");
  }
  if (emb.q == nullptr || tokens == nullptr || x == nullptr || emb.cols <= 0 || emb.rows <= 0 ||
      n <= 0 || ldx < emb.cols) {
    fail("embed_batch: null pointer, empty matrix or bad shape (n=", n, ", ldx=", ldx,
         ", cols=", emb.cols, ")");
  }
  if (emb.type != GgmlType::F32 && emb.type != GgmlType::F16 &&
      (emb.d == nullptr || emb.cols % 32 != 0)) {
    fail("embed_batch: quantized matrix without scales or cols=", emb.cols,
         " not a multiple of 32");
  }
  launch_kernel(embed_batch_kernel, dim3(n), dim3(256), 0, s, emb, tokens, x, ldx);
}

}  // namespace smolrt::cuda
