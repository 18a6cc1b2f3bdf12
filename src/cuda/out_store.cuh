// Stores of the kernels whose output is fp32 or fp16 (the caller sets exactly one of out and
// out_h): fp16 feeds the dense GEMMs' input as is, rounded to nearest from the fp32 value.
#pragma once

#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

namespace smolrt::cuda {

__device__ __forceinline__ void store_out(float* out, uint16_t* out_h, size_t i, float v) {
  if (out_h)
    out_h[i] = __half_as_ushort(__float2half_rn(v));
  else
    out[i] = v;
}

// Elements i and i + 1 (i even: 8-byte fp32, 4-byte fp16 stores).
__device__ __forceinline__ void store_out2(float* out, uint16_t* out_h, size_t i, float x,
                                           float y) {
  if (out_h)
    *reinterpret_cast<__half2*>(out_h + i) = __floats2half2_rn(x, y);
  else
    *reinterpret_cast<float2*>(out + i) = make_float2(x, y);
}

}  // namespace smolrt::cuda
