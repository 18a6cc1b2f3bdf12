// Device helpers shared by the two multi-token GEMM kernels (gemm_small.cu, gemm_tc.cu):
// weight-block readers for raw GGUF Q4_0 / Q8_0 blocks and the pair-wise fused epilogues.
// Internal to src/cuda; the public entry point is gemm_quant.h.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/gemm_quant.h"
#include "quant/formats.h"

namespace smolrt::cuda::detail {

__device__ __forceinline__ float half_bits_to_f32(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}

// --- weight blocks ----------------------------------------------------------------------------
// Blocks are 18 / 34 bytes, so only 2-byte alignment is guaranteed: all reads are u16.
template <class B>
struct WBlock;

template <>
struct WBlock<BlockQ4_0> {
  static constexpr int kHalves = 9;  // u16 words per block
  // Sub-slice s (0..3) of 8 weights as small ints: q[0..3] at block offsets 4s.., q[4..7] at
  // 16+4s... Returns the scale d.
  __device__ __forceinline__ static float load8(const BlockQ4_0* b, int s, float q[8], int& k0,
                                                int& k1) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(b);
    const uint32_t v = (uint32_t)p[1 + 2 * s] | ((uint32_t)p[2 + 2 * s] << 16);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      q[j] = (float)(int)((v >> (8 * j)) & 15u) - 8.f;
      q[4 + j] = (float)(int)((v >> (8 * j + 4)) & 15u) - 8.f;
    }
    k0 = 4 * s;
    k1 = 16 + 4 * s;
    return half_bits_to_f32(p[0]);
  }
  // Raw words -> 32 fp16 weights in block order.
  __device__ __forceinline__ static void dequant32(const uint16_t* r, __half2 out[16]) {
    const float d = half_bits_to_f32(r[0]);
#pragma unroll
    for (int j = 0; j < 8; ++j) {  // qs bytes 2j, 2j+1 live in word 1+j
      const uint32_t w = r[1 + j];
      const float a0 = (float)(int)(w & 15u) - 8.f, a1 = (float)(int)((w >> 8) & 15u) - 8.f;
      const float b0 = (float)(int)((w >> 4) & 15u) - 8.f, b1 = (float)(int)((w >> 12) & 15u) - 8.f;
      out[j] = __floats2half2_rn(a0 * d, a1 * d);      // weights 2j, 2j+1
      out[8 + j] = __floats2half2_rn(b0 * d, b1 * d);  // weights 16+2j, 17+2j
    }
  }
};

template <>
struct WBlock<BlockQ8_0> {
  static constexpr int kHalves = 17;
  __device__ __forceinline__ static float load8(const BlockQ8_0* b, int s, float q[8], int& k0,
                                                int& k1) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(b);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint16_t w = p[1 + 4 * s + j];
      q[2 * j] = (float)(int8_t)(w & 0xff);
      q[2 * j + 1] = (float)(int8_t)(w >> 8);
    }
    k0 = 8 * s;
    k1 = 8 * s + 4;
    return half_bits_to_f32(p[0]);
  }
  __device__ __forceinline__ static void dequant32(const uint16_t* r, __half2 out[16]) {
    const float d = half_bits_to_f32(r[0]);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const uint16_t w = r[1 + j];
      out[j] = __floats2half2_rn((float)(int8_t)(w & 0xff) * d, (float)(int8_t)(w >> 8) * d);
    }
  }
};

// --- epilogue -----------------------------------------------------------------------------------
// Writes output columns (c, c+1) of token t; c is even. v1 is ignored when c+1 >= n.
template <GemmEpilogue E>
__device__ __forceinline__ void epi_pair(const GemmOut& o, int n, int t, int c, float v0,
                                         float v1) {
  if constexpr (E == GemmEpilogue::Store || E == GemmEpilogue::Accumulate) {
    float* y = o.y + (size_t)t * o.ldy + c;
    if constexpr (E == GemmEpilogue::Accumulate) {
      v0 += y[0];
      if (c + 1 < n) v1 += y[1];
    }
    y[0] = v0;
    if (c + 1 < n) y[1] = v1;
  } else if constexpr (E == GemmEpilogue::SiluPair) {
    o.y[(size_t)t * o.ldy + c / 2] = v0 / (1.f + expf(-v0)) * v1;
  } else {  // QkvRope
    const int pos = o.pos0 + t;
    const bool is_q = c < o.q_dim;
    const int cc = is_q ? c : (c - o.q_dim) % o.kv_dim;  // column inside q, k or v
    const bool is_v = !is_q && c >= o.q_dim + o.kv_dim;
    if (!is_v) {
      const int i = (cc % o.head_dim) / 2;
      if (2 * i < o.rope_dim) {
        const float theta = (float)pos * powf(o.rope_base, -(float)(2 * i) / (float)o.rope_dim);
        float sn, cs;
        sincosf(theta, &sn, &cs);
        const float r0 = v0 * cs - v1 * sn, r1 = v0 * sn + v1 * cs;
        v0 = r0;
        v1 = r1;
      }
    }
    if (is_q) {
      float* y = o.y + (size_t)t * o.ldy + cc;
      y[0] = v0;
      y[1] = v1;
    } else {
      void* cache = is_v ? o.v_cache : o.k_cache;
      const size_t off = (size_t)pos * o.kv_dim + cc;
      if (o.kv_half) {
        reinterpret_cast<__half2*>(cache)[off / 2] = __floats2half2_rn(v0, v1);
      } else {
        float* p = reinterpret_cast<float*>(cache) + off;
        p[0] = v0;
        p[1] = v1;
      }
    }
  }
}

// Writes a BM x BN fp32 tile staged in shared memory (row pitch LDC) through the epilogue: two
// adjacent columns per thread, consecutive threads on consecutive pairs (coalesced stores). Rows
// are scaled by rs[r] when the GEMM normalized its input (norm); the partial sums of a K split
// (gridDim.z > 1, Accumulate only) are added atomically.
template <GemmEpilogue E, int BM, int BN, int LDC, int NT>
__device__ __forceinline__ void store_tile(const GemmArgs& a, const GemmOut& o, const float* Cs,
                                           const float* rs, bool norm, int t0, int n0, int tid) {
  for (int p = tid; p < BM * (BN / 2); p += NT) {
    const int r = p / (BN / 2), c = (p % (BN / 2)) * 2;
    const int tok = t0 + r, col = n0 + c;
    if (tok < a.t && col < a.n) {
      const float sc = norm ? rs[r] : 1.f;
      const float v0 = Cs[r * LDC + c] * sc, v1 = Cs[r * LDC + c + 1] * sc;
      if (E == GemmEpilogue::Accumulate && gridDim.z > 1) {
        float* y = o.y + (size_t)tok * o.ldy + col;
        atomicAdd(y, v0);
        if (col + 1 < a.n) atomicAdd(y + 1, v1);
      } else {
        epi_pair<E>(o, a.n, tok, col, v0, v1);
      }
    }
  }
}

// Launchers (host), one per kernel family; shapes already checked by gemm_quant().
template <class B, GemmEpilogue E>
void launch_gemm_small(const GemmArgs& a, const GemmOut& o, cudaStream_t s);
template <class B, GemmEpilogue E>
void launch_gemm_tc(const GemmArgs& a, const GemmOut& o, cudaStream_t s);
// gemm_pipe.cu (cp.async pipeline); false when the weights are not 4-byte aligned per row (the
// caller then runs gemm_tc's register-lookahead kernel). sms: multiprocessor count.
template <class B, GemmEpilogue E>
bool launch_gemm_pipe(const GemmArgs& a, const GemmOut& o, int sms, cudaStream_t s);

}  // namespace smolrt::cuda::detail
