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

// One quant block's dot product with x[0..31], before the block scale, in the one order every
// decode kernel uses. Q4_0: 16 bytes, low nibbles are elements 0-15, high nibbles 16-31. Q8_0: 32
// int8 (w0, w1); int8 ^ 0x80 is the int8 + 128 as an unsigned byte. x indexes fold to registers
// once the caller's loops are unrolled.
__device__ __forceinline__ float q4_block_dot(const uint4& w, const float* x) {
  const uint32_t ww[4] = {w.x, w.y, w.z, w.w};
  float t = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t lo = ww[i] & 0x0F0F0F0Fu, hi = (ww[i] >> 4) & 0x0F0F0F0Fu;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = 4 * i + e;
      t += (byte_plus_2p23(lo, e) - kQ4Bias) * x[j] + (byte_plus_2p23(hi, e) - kQ4Bias) * x[j + 16];
    }
  }
  return t;
}
__device__ __forceinline__ float q8_block_dot(const uint4& w0, const uint4& w1, const float* x) {
  const uint32_t ww[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
  float t = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t u = ww[i] ^ 0x80808080u;
#pragma unroll
    for (int e = 0; e < 4; ++e) t += (byte_plus_2p23(u, e) - kQ8Bias) * x[4 * i + e];
  }
  return t;
}

// RoPE: frequency base^(-2i/rope_dim) of rotation pair i; the angle at position p is p times it
// (the expression every RoPE kernel and the CPU twin use).
__device__ __forceinline__ float rope_inv_freq(int i, int rope_dim, float base) {
  return powf(base, -(float)(2 * i) / (float)rope_dim);
}

// fp16 pair as the 32-bit register an mma operand takes.
__device__ __forceinline__ uint32_t half2_bits(__half2 v) {
  return *reinterpret_cast<uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t pack_half2(float a, float b) {
  return half2_bits(__floats2half2_rn(a, b));
}

// D = A*B + D, m16n8k16, fp16 operands, fp32 accumulators (sm_80+).
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

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
