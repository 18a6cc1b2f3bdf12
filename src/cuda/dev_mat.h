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

}  // namespace smolrt::cuda
