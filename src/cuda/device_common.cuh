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

// x.x^2 + x.y^2 + x.z^2 + x.w^2, summed in that order (RMSNorm's sum of squares).
__device__ __forceinline__ float sum_sq(float4 v) {
  return v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
}

// A KV cache element (fp32 or fp16 pool) as fp32, at the point of use.
__device__ __forceinline__ float to_f32(float x) {
  return x;
}
__device__ __forceinline__ float to_f32(__half x) {
  return __half2float(x);
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

// A load with acquire semantics at GPU scope: the loads after it see what the writer released
// before the value it reads (a flag or counter another block set after a fence).
__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Folds n (<= S) partial softmax states of one output column (flash-decoding's key splits,
// written by other blocks or launches) into the state (mm, den, num): split s's base-2 running
// max at p[s * stride + m_at], its sum of exponentials at m_at + 1 and its unnormalized output at
// o_at; mm = -inf: no state yet. Every split is loaded at once (one round trip to L2, where a
// loop over the max and then the sums makes two), then combined. At least one split (or the
// state) must hold a key.
template <int S>
__device__ __forceinline__ void merge_partials(const float* p, int n, size_t stride, int m_at,
                                               int o_at, float& mm, float& den, float& num) {
  float ms[S], ls[S], os[S];
#pragma unroll
  for (int s = 0; s < S; ++s) {
    ms[s] = s < n ? __ldcg(p + s * stride + m_at) : -INFINITY;
    ls[s] = s < n ? __ldcg(p + s * stride + m_at + 1) : 0.f;
    os[s] = s < n ? __ldcg(p + s * stride + o_at) : 0.f;
  }
  float m = mm;
#pragma unroll
  for (int s = 0; s < S; ++s) m = fmaxf(m, ms[s]);
  const float w0 = mm == -INFINITY ? 0.f : exp2f(mm - m);
  num *= w0, den *= w0;
#pragma unroll
  for (int s = 0; s < S; ++s) {
    const float w = ms[s] == -INFINITY ? 0.f : exp2f(ms[s] - m);  // an empty split adds nothing
    den += w * ls[s];
    num += w * os[s];
  }
  mm = m;
}

// RoPE: frequency base^(-2i/rope_dim) of rotation pair i; the angle at position p is p times it
// (the expression every RoPE kernel and the CPU twin use).
__device__ __forceinline__ float rope_inv_freq(int i, int rope_dim, float base) {
  return powf(base, -(float)(2 * i) / (float)rope_dim);
}

// The FFN gate's activation times up (ModelConfig::act: 0 = SiLU, 1 = GELU with the tanh
// approximation, gemma's gelu_pytorch_tanh); the expressions of the CPU twin (backend/cpu/ops).
__device__ __forceinline__ float gate_act(float g, int act) {
  if (act == 1) {
    constexpr float kC = 0.7978845608028654f;  // sqrt(2 / pi)
    return 0.5f * g * (1.f + tanhf(kC * (g + 0.044715f * g * g * g)));
  }
  return g / (1.f + expf(-g));
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

// ldmatrix (sm_75+): 8x8 fp16 matrices out of shared memory, lane i giving the address of row
// i % 8 of matrix i / 8 (16 bytes each). x4: four matrices (r[0..3]); x2: two, from lanes 0-15.
// .trans transposes each matrix: the B operand (k x n) of an mma from a row-major k x n tile.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const void* smem) {
  const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(s));
}

// Element (r, c) of m (any format of qformat.h, in its device layout), as the CPU reference
// dequantizes it (for embedding rows: one row per token, not a hot loop).
__device__ __forceinline__ float dequant_at(const DevMat& m, size_t r, int c) {
  float v = 0.f;
  dispatch_format(m.type, [&](auto tag) {
    using F = QFormat<decltype(tag)::value>;
    if constexpr (F::kLayout.block) {
      const int nb = m.cols / F::kLayout.qk;
      v = F::at(m.q, m.d, r * nb + c / F::kLayout.qk, c % F::kLayout.qk);
    } else {
      v = F::elem(m.q, r * m.cols + c);
    }
  });
  return v;
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

// Cache row of position t: t, or t % ring for a sliding-window layer's ring cache (ring > 0).
__device__ __forceinline__ int cache_row(int t, int ring) {
  return ring > 0 ? t % ring : t;
}

}  // namespace smolrt::cuda
