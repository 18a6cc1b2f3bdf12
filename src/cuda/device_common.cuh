// Small device helpers shared by the decode kernels: warp reductions, Programmatic Dependent
// Launch (PDL) controls, fp16 loads.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/dev_mat.h"

namespace smolrt::cuda {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// PDL: wait until the previous kernel in the stream has completed and its writes are visible.
// Every thread of every decode kernel calls this before touching activations (and before any
// early return), so completion stays transitive along the chain. A no-op without the launch
// attribute.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// PDL: let the next kernel's blocks get scheduled (they park in pdl_wait) so its launch latency
// overlaps our tail.
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Hopper bulk prefetch of [ptr, ptr+bytes) into L2 (bytes a multiple of 16, ptr 16-aligned).
__device__ __forceinline__ void prefetch_l2(const void* ptr, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(ptr), "r"(bytes) : "memory");
#endif
}

// 2^23 + byte e of v, as a float: PRMT puts the byte under the exponent of 2^23, so subtracting
// a bias gives small integers EXACTLY (bit-identical to a cast). This replaces I2F, a
// quarter-rate conversion on Hopper (16/clk/SM) that bounded the dequantizing matvecs; PRMT and
// FADD run at full rate. e must fold to a constant (unrolled loops).
__device__ __forceinline__ float byte_plus_2p23(uint32_t v, int e) {
  return __int_as_float((int)__byte_perm(v, 0x4B000000u, 0x7440u | (unsigned)e));
}
constexpr float kQ4Bias = 8388616.f;  // 2^23 + 8: nibble n -> n - 8 (Q4_0)
constexpr float kQ8Bias = 8388736.f;  // 2^23 + 128: byte of (int8 ^ 0x80) -> the int8 (Q8_0)

__device__ __forceinline__ float half_bits_to_float(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}

// Element (r, c) of m (split layout for the quant types, dev_mat.h), exactly as cpu::embed /
// cuda::embed dequantize it.
__device__ __forceinline__ float dequant_at(const DevMat& m, size_t r, int c) {
  if (m.type == GgmlType::F32) return static_cast<const float*>(m.q)[r * m.cols + c];
  if (m.type == GgmlType::F16) {
    return half_bits_to_float(static_cast<const uint16_t*>(m.q)[r * m.cols + c]);
  }
  const int nb = m.cols / 32, b = c / 32, j = c % 32;
  const float d = half_bits_to_float(m.d[r * nb + b]);
  const uint8_t* q = static_cast<const uint8_t*>(m.q);
  if (m.type == GgmlType::Q8_0) return (float)(int8_t)q[(r * nb + b) * 32 + j] * d;
  const uint8_t byte = q[(r * nb + b) * 16 + (j & 15)];  // Q4_0: low nibble for j < 16
  return (float)((int)(j < 16 ? (byte & 15) : (byte >> 4)) - 8) * d;
}

// cp.async (sm_80+): 16-byte global->shared copies that complete in groups; src_bytes < 16
// zero-fills the rest (0 = a pure zero fill for out-of-range tiles).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

}  // namespace smolrt::cuda
