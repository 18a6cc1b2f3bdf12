// Flash-style causal GQA attention for prefill: the argument checks, the dispatch, and the fp32
// SIMT kernel for head_dim 8 (the tiny test models; 16..256 take the tensor-core kernel of
// attention_prefill_tc.cu). One 128-thread block per (16 queries, head):
// 8 threads per query, each owning 8 of the 64 keys of a tile (scores) and head_dim/8 adjacent
// output dims (P*V). The query lives in registers and K/V rows are read as float4 from shared
// memory (4 FMAs per shared load: the loop is shared-memory-bandwidth-bound otherwise). K/V tiles
// go through shared memory once per block instead of once per query; the softmax is online
// (running max + sum, exp2 with log2(e) folded into the query scale).
#include "cuda/attention_prefill.h"

#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "core/cuda_check.h"
#include "core/error.h"
#include "cuda/launch.cuh"
#include "cuda/out_store.cuh"

namespace smolrt::cuda {
namespace detail {
// attention_prefill_tc.cu: tensor-core path (head_dim 16/32/64); false = not taken.
bool attention_prefill_tc(const AttentionPrefillArgs& a, const Launch& s);
}  // namespace detail
namespace {

using detail::pdl_trigger;
using detail::pdl_wait;

constexpr int kQT = 16;  // queries per block
static_assert(attention_prefill_query_tile(8) == kQT, "the tile lists' unit");
constexpr int kKT = 64;  // keys per tile

// One 8-element slice of a K row and the matching V row, held in registers between the global
// load of the next tile and its store to shared memory (prefetch overlaps the current tile's math).
template <class KV>
struct KvRaw;
template <>
struct KvRaw<__half> {
  uint4 k, v;
  __device__ void load(const __half* kp, const __half* vp) {
    k = *reinterpret_cast<const uint4*>(kp);
    v = *reinterpret_cast<const uint4*>(vp);
  }
  __device__ void zero() { k = v = make_uint4(0, 0, 0, 0); }
  __device__ static void put(const uint4& u, float* dst) {
    const __half2* h = reinterpret_cast<const __half2*>(&u);
    const float2 a = __half22float2(h[0]), b = __half22float2(h[1]), c = __half22float2(h[2]),
                 d = __half22float2(h[3]);
    *reinterpret_cast<float4*>(dst) = make_float4(a.x, a.y, b.x, b.y);
    *reinterpret_cast<float4*>(dst + 4) = make_float4(c.x, c.y, d.x, d.y);
  }
  __device__ void store(float* ks, float* vs) const { put(k, ks), put(v, vs); }
};
template <>
struct KvRaw<float> {
  float4 k0, k1, v0, v1;
  __device__ void load(const float* kp, const float* vp) {
    k0 = *reinterpret_cast<const float4*>(kp), k1 = *reinterpret_cast<const float4*>(kp + 4);
    v0 = *reinterpret_cast<const float4*>(vp), v1 = *reinterpret_cast<const float4*>(vp + 4);
  }
  __device__ void zero() { k0 = k1 = v0 = v1 = make_float4(0.f, 0.f, 0.f, 0.f); }
  __device__ void store(float* ks, float* vs) const {
    *reinterpret_cast<float4*>(ks) = k0, *reinterpret_cast<float4*>(ks + 4) = k1;
    *reinterpret_cast<float4*>(vs) = v0, *reinterpret_cast<float4*>(vs + 4) = v1;
  }
};

template <int HD, class KV>
__global__ void __launch_bounds__(128)
    attention_prefill_kernel(AttentionPrefillArgs a, float qscale) {
  constexpr int DU = HD / 8;  // output dims per thread: [sub*DU, sub*DU + DU)
  constexpr int KP = HD + 4;  // K pitch: the 8 rows a quarter-warp reads hit distinct banks
  __shared__ __align__(16) float Ks[kKT][KP];
  __shared__ __align__(16) float Vs[kKT][HD];
  __shared__ float Ps[kQT][kKT + 1];     // +1: the 4 query rows a warp reads sit in different banks
  constexpr int kSlices = kKT * HD / 8;  // 8-element K/V slices per tile
  constexpr int kIters = (kSlices + 127) / 128;  // per thread

  const KV* kc = static_cast<const KV*>(a.k_cache);
  const KV* vc = static_cast<const KV*>(a.v_cache);
  const int kv_dim = a.n_kv_heads * HD;
  const int h = blockIdx.y, kvh = h / (a.n_heads / a.n_kv_heads);
  const int tid = threadIdx.x, qi = tid >> 3, sub = tid & 7;
  // Without spans the longest (latest) query tiles first; spans list theirs in that order.
  PrefillSpan sp;
  int q0;
  if (!prefill_tile(a, a.spans ? (int)blockIdx.x : (int)(gridDim.x - 1 - blockIdx.x), kQT, sp, q0))
    return;
  const bool valid = q0 + qi < sp.n_tokens;
  const int qpos = sp.start + q0 + qi;
  const int n_keys = sp.start + min(q0 + kQT, sp.n_tokens);  // keys the block's last query sees
  // Sliding window: this query sees keys > qlo; tiles before the block's first query's window
  // are skipped.
  const int qlo = a.window > 0 ? qpos - a.window : -1;
  const int kbeg = a.window > 0 ? max(0, sp.start + q0 - a.window + 1) / kKT * kKT : 0;

  pdl_wait();  // q and the cache come from the QKV GEMM
  pdl_trigger();
  float qr[HD];  // this thread's query, pre-scaled by log2(e)/sqrt(head_dim); registers
  {
    const float* qp = a.q + (size_t)(sp.row0 + (valid ? q0 + qi : 0)) * a.ldq + h * HD;
#pragma unroll
    for (int d = 0; d < HD; d += 4) {
      const float4 v = *reinterpret_cast<const float4*>(qp + d);
      qr[d] = v.x * qscale, qr[d + 1] = v.y * qscale, qr[d + 2] = v.z * qscale,
      qr[d + 3] = v.w * qscale;
    }
  }
  float m = -INFINITY, l = 0.f, acc[DU];
#pragma unroll
  for (int u = 0; u < DU; ++u) acc[u] = 0.f;

  KvRaw<KV> pre[kIters];
  auto kv_load = [&](int k0) {
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int i = tid + 128 * it;
      const int j = i / (HD / 8), d = (i % (HD / 8)) * 8, kp = k0 + j;
      if (i < kSlices && kp < n_keys) {
        const size_t off = (size_t)key_row(a, sp, kp) * kv_dim + kvh * HD + d;
        pre[it].load(kc + off, vc + off);
      } else {
        pre[it].zero();
      }
    }
  };
  kv_load(kbeg);
  for (int k0 = kbeg; k0 < n_keys; k0 += kKT) {
    __syncthreads();  // previous tile fully consumed
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int i = tid + 128 * it;
      if (i < kSlices) {
        const int j = i / (HD / 8), d = (i % (HD / 8)) * 8;
        pre[it].store(&Ks[j][d], &Vs[j][d]);
      }
    }
    __syncthreads();
    if (k0 + kKT < n_keys) kv_load(k0 + kKT);  // in flight during this tile's math

    float s[8], mt = -INFINITY;
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int j = sub + 8 * u;
      float dot = 0.f;
#pragma unroll
      for (int d = 0; d < HD; d += 4) {
        const float4 k4 = *reinterpret_cast<const float4*>(&Ks[j][d]);
        dot = fmaf(qr[d], k4.x, dot);
        dot = fmaf(qr[d + 1], k4.y, dot);
        dot = fmaf(qr[d + 2], k4.z, dot);
        dot = fmaf(qr[d + 3], k4.w, dot);
      }
      s[u] = (valid && k0 + j <= qpos && k0 + j > qlo) ? dot : -INFINITY;
      mt = fmaxf(mt, s[u]);
    }
#pragma unroll
    for (int off = 1; off < 8; off <<= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, off));
    const float m_new = fmaxf(m, mt);
    const float mref = m_new == -INFINITY ? 0.f : m_new;  // fully masked row: keep NaN out
    const float alpha = exp2f(m - mref);
    float ls = 0.f;
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const float p = exp2f(s[u] - mref);
      Ps[qi][sub + 8 * u] = p;
      ls += p;
    }
#pragma unroll
    for (int off = 1; off < 8; off <<= 1) ls += __shfl_xor_sync(0xffffffffu, ls, off);
    l = l * alpha + ls;
    m = m_new;
    __syncwarp();  // the 8 writers of row qi are its 8 readers, all in this warp
#pragma unroll
    for (int u = 0; u < DU; ++u) acc[u] *= alpha;
    const int jmax = min(kKT, n_keys - k0);
    const float* vrow = &Vs[0][sub * DU];
    for (int j = 0; j < jmax; ++j, vrow += HD) {
      const float p = Ps[qi][j];
      if constexpr (DU % 4 == 0) {
#pragma unroll
        for (int u = 0; u < DU; u += 4) {
          const float4 v4 = *reinterpret_cast<const float4*>(vrow + u);
          acc[u] = fmaf(p, v4.x, acc[u]);
          acc[u + 1] = fmaf(p, v4.y, acc[u + 1]);
          acc[u + 2] = fmaf(p, v4.z, acc[u + 2]);
          acc[u + 3] = fmaf(p, v4.w, acc[u + 3]);
        }
      } else {
#pragma unroll
        for (int u = 0; u < DU; ++u) acc[u] = fmaf(p, vrow[u], acc[u]);
      }
    }
  }
  if (valid) {
    const float inv = 1.f / l;
    const size_t o = (size_t)(sp.row0 + q0 + qi) * a.ldo + h * HD + sub * DU;
#pragma unroll
    for (int u = 0; u < DU; ++u) store_out(a.out, a.out_h, o + u, acc[u] * inv);
  }
}

void launch_simt8(const AttentionPrefillArgs& a, const Launch& s) {
  const dim3 grid((unsigned)(a.spans ? a.max_tiles : (a.n_tokens + kQT - 1) / kQT),
                  (unsigned)a.n_heads);
  const float qscale = 1.4426950408889634f * (a.scale > 0.f ? a.scale : 1.f / sqrtf(8.f));
  if (a.kv_half) {
    detail::launch_pdl(attention_prefill_kernel<8, __half>, grid, dim3(128), s, a, qscale);
  } else {
    detail::launch_pdl(attention_prefill_kernel<8, float>, grid, dim3(128), s, a, qscale);
  }
}

}  // namespace

bool attention_prefill_supports(int hd) {
  return hd == 8 || hd == 16 || hd == 32 || hd == 64 || hd == 128 || hd == 256;
}

void attention_prefill(const AttentionPrefillArgs& a, const Launch& s) {
  if (!a.q || !a.k_cache || !a.v_cache) fail("attention_prefill: null pointer");
  if (!a.out == !a.out_h) fail("attention_prefill: set exactly one of out (fp32) and out_h (fp16)");
  if (a.n_tokens <= 0 || a.start < 0)
    fail("attention_prefill: n_tokens=", a.n_tokens, " start=", a.start, " out of range");
  if (a.n_heads <= 0 || a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0)
    fail("attention_prefill: n_heads=", a.n_heads,
         " must be a multiple of n_kv_heads=", a.n_kv_heads);
  if (a.ldq < a.n_heads * a.head_dim || a.ldo < a.n_heads * a.head_dim)
    fail("attention_prefill: ldq=", a.ldq, "/ldo=", a.ldo, " < n_heads*head_dim");
  if (a.ldq % 4 != 0 || (reinterpret_cast<uintptr_t>(a.q) & 15u) ||
      (reinterpret_cast<uintptr_t>(a.k_cache) & 15u) ||
      (reinterpret_cast<uintptr_t>(a.v_cache) & 15u))
    fail("attention_prefill: q (ldq=", a.ldq, ") and the caches must be 16-byte aligned");
  if (a.window < 0 || !(a.scale >= 0.f))
    fail("attention_prefill: window=", a.window, " scale=", a.scale, " out of range");
  if (a.table && (a.ring != 0 || a.page_size <= 0 || (a.page_size & (a.page_size - 1))))
    fail("attention_prefill: a page table needs a power-of-two page size (", a.page_size,
         ") and no ring (", a.ring, ")");
  if (a.contiguous && !a.table)
    fail("attention_prefill: consecutive pages (contiguous) need a page table");
  if (a.spans && (!a.table || !a.tiles || a.ring != 0 || a.table_stride < 0 || a.max_tiles <= 0))
    fail("attention_prefill: spans read their keys through a page table and need a tile list (",
         "ring ", a.ring, ", table_stride ", a.table_stride, ", max_tiles ", a.max_tiles, ")");
  if (a.ring < 0 || (a.ring > 0 && (a.window <= 0 || a.ring < a.window + a.n_tokens - 1)))
    fail("attention_prefill: a ring of ", a.ring, " cache rows cannot hold a window of ", a.window,
         " and a chunk of ", a.n_tokens, " tokens");
  if (a.head_dim == 8) return launch_simt8(a, s);
  if (!detail::attention_prefill_tc(a, s))
    fail("attention_prefill: head_dim=", a.head_dim,
         " is not supported (8, 16, 32, 64, 128, 256); use per-token attention");
}

}  // namespace smolrt::cuda
