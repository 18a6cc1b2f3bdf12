// Device-side view of one weight matrix as uploaded by the CUDA backend (plain header: host and
// device code both include it).
//
// Layouts (all lossless, each matrix starts 256-byte aligned inside the one weight allocation):
//   F32, F16: rows x cols elements, row-major, exactly as in the GGUF file.
//   Q4_0, Q8_0: "split" layout, repacked at upload so every block's quants are 16-byte aligned
//     (an 18/34-byte GGUF block is not): q = rows x (cols/32) x {16 | 32} bytes of quants in the
//     GGUF byte order, then d = rows x (cols/32) fp16 scales. Dequantizing gives bit-identical
//     weights to the GGUF blocks.
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/formats.h"

namespace smolrt::cuda {

struct DevMat {
  GgmlType type = GgmlType::F32;
  int rows = 0;                 // output dimension
  int cols = 0;                 // input dimension (multiple of 32 for Q4_0/Q8_0)
  const void* q = nullptr;      // F32/F16 elements, or the quant bytes of the split layout
  const uint16_t* d = nullptr;  // split layout: fp16 scales [rows][cols/32]; nullptr for F32/F16
};

// Bytes of quants per 32-weight block in the split layout.
constexpr int split_qbytes(GgmlType t) {
  return t == GgmlType::Q4_0 ? 16 : 32;
}

// Bytes of m's device image (quants + scales for the split layout), starting at m.q.
inline size_t dev_mat_bytes(const DevMat& m) {
  const size_t n = (size_t)m.rows * m.cols;
  if (m.type == GgmlType::F32) return n * 4;
  if (m.type == GgmlType::F16) return n * 2;
  return (n / 32) * (split_qbytes(m.type) + 2);
}

// A byte range of weights to pull into L2 ahead of use (cp.async.bulk.prefetch.L2, a hint that
// never changes results): the decode step passes the next layer's matrices of the same kind.
struct L2Prefetch {
  const void* ptr = nullptr;  // 16-byte aligned
  size_t bytes = 0;           // rounded up to 16 by the launcher; stays inside the allocation
};

}  // namespace smolrt::cuda
