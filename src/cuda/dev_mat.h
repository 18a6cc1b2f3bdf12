// Device-side view of one weight matrix as uploaded by the CUDA backend (plain header: host and
// device code both include it).
//
// Layouts (all lossless, each matrix starts 256-byte aligned inside the one weight allocation),
// described per format in cuda/qformat.h:
//   F32, F16, BF16: rows x cols elements, row-major, exactly as in the GGUF file.
//   block formats (Q4_0 ... Q6_K): "split" layout, repacked at upload so every block's payload is
//     16-byte aligned (most GGUF blocks are not): q = rows x blocks x kPay payload bytes, then
//     d = rows x blocks x kMeta bytes of scales / minima / high bits. Dequantizing gives
//     bit-identical weights to the GGUF blocks.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/qformat.h"
#include "quant/formats.h"

namespace smolrt::cuda {

struct DevMat {
  GgmlType type = GgmlType::F32;
  int rows = 0;                 // output dimension
  int cols = 0;                 // input dimension (a multiple of the block size for block formats)
  const void* q = nullptr;      // F32/F16/BF16 elements, or the payload bytes of the split layout
  const uint16_t* d = nullptr;  // split layout: the meta bytes; nullptr for float formats
};

}  // namespace smolrt::cuda
