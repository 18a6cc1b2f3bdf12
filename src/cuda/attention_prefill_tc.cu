// Tensor-core causal GQA attention for prefill (FlashAttention-2 style), fp16 or fp32 KV cache
// (staged in shared memory as fp16 either way), head_dim 16..256. A 128-thread block owns 64
// queries of one head: each warp 16 query rows, their scores and output stay in mma.sync m16n8k16
// register fragments (fp16 operands, fp32 accumulate). K/V tiles of 64 keys (32 when the whole
// context fits in one) stream through shared memory with cp.async, double-buffered so the next
// tile's loads are in flight during this tile's math (the SIMT kernel was shared-memory-bound: 4
// FMAs per shared load; here one ldmatrix feeds 2 MMAs of 256 FMAs each). The score fragment (C
// layout) is re-packed in registers as the A operand of P*V, so P never touches shared memory.
// Query, K, V and P are rounded to fp16 (scores/sums/output stay fp32).
//
// Wide heads (128, 256: gemma3) keep the same fragments but would not fit the registers with the
// query held there too (the 16 x 256 output alone is 128 per lane), so the query tile sits in
// shared memory (fp16, read per 16-wide chunk with ldmatrix), key tiles are 32 wide and there is
// one key group; an fp32 cache streams through a shared fp32 staging tile with cp.async (the next
// tile in flight during this one's math; a second staging tile would gain nothing) and is
// converted to the fp16 tile there (register prefetch of a 32 x 256 fp32 tile would not fit).
// Sliding windows mask keys at or below pos - window and skip the tiles wholly before them.
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "core/cuda_check.h"
#include "cuda/attention_prefill.h"
#include "cuda/launch.cuh"
#include "cuda/out_store.cuh"

namespace smolrt::cuda::detail {
namespace {

constexpr int kWarps = 4, kBQ = 16 * kWarps, kKT = 64;
static_assert(attention_prefill_query_tile(16) == kBQ && attention_prefill_query_tile(256) == kBQ,
              "the tile lists' unit");

// Shared memory of one block: [fp16 query tile (wide heads)] [KS key groups x stages x (K, V)
// fp16 tiles of KT x P] [fp32 staging K, V tiles (wide heads, fp32 cache)].
template <int HD, class KV, int KS, int KT>
struct TcSmem {
  static constexpr bool kWide = HD > 64, kHalf = std::is_same_v<KV, __half>;
  static constexpr int P = HD + 8;  // fp16 row pitch: +16 B puts the 8 rows of a fragment in
                                    // distinct banks (32-bit K reads, ldmatrix on Q and V)
  static constexpr int kStages = kWide && !kHalf ? 1 : 2;
  static constexpr size_t q = kWide ? (size_t)kBQ * P * 2 : 0;
  static constexpr size_t tiles = (size_t)KS * kStages * 2 * KT * P * 2;
  static constexpr size_t staging = kWide && !kHalf ? (size_t)2 * KT * HD * 4 : 0;
  static constexpr size_t bytes = q + tiles + staging;
};

// KS key groups of 4 warps each: group g takes key tiles g, g+KS, ... for the same 64 queries
// (halves the serial tile chain of the longest query tile at KS=2); the partial (m, l, O) of
// the groups merge through shared memory at the end.
template <int HD, class KV, int KS, int KT>
__global__ void __launch_bounds__(kWarps * 32 * KS)
    attention_prefill_tc_kernel(AttentionPrefillArgs a, float qscale) {
  static_assert(KT == 32 || KT == 64, "key tiles of 32 or 64");
  using L = TcSmem<HD, KV, KS, KT>;
  constexpr bool kWide = L::kWide, kHalf = L::kHalf;
  static_assert(!kWide || KS == 1, "wide heads: one key group");
  constexpr int NTK = KT / 8;  // 8-key score tiles per key tile
  constexpr int P = L::P;
  constexpr int KC = HD / 16;                                 // 16-wide k chunks of QK^T
  constexpr int DT = HD / 8;                                  // 8-wide output column tiles
  constexpr int kChunks = HD / 8;                             // 16-byte fp16 chunks per K/V row
  extern __shared__ __align__(128) unsigned char smem_raw[];  // TcSmem
  const int tid_all = threadIdx.x, kg = tid_all / (kWarps * 32);
  __half* const Qs = reinterpret_cast<__half*>(smem_raw);
  __half* gbase = reinterpret_cast<__half*>(smem_raw + L::q) + (size_t)kg * L::kStages * 2 * KT * P;
  float* const stg = reinterpret_cast<float*>(smem_raw + L::q + L::tiles);  // K, V: KT x HD
  auto Ks = [&](int st) { return gbase + (2 * st) * KT * P; };
  auto Vs = [&](int st) { return gbase + (2 * st + 1) * KT * P; };
  auto group_sync = [&] {  // named barrier per key group (ids 1, 2), its 128 threads only;
                           // immediate ids so the kernel reserves 3 barriers, not all 16
    if (KS == 1 || kg == 0) {
      asm volatile("bar.sync 1, %0;" ::"n"(kWarps * 32) : "memory");
    } else {
      asm volatile("bar.sync 2, %0;" ::"n"(kWarps * 32) : "memory");
    }
  };

  const KV* kc = static_cast<const KV*>(a.k_cache);
  const KV* vc = static_cast<const KV*>(a.v_cache);
  const int kv_dim = a.n_kv_heads * HD;
  const int h = blockIdx.y, kvh = h / (a.n_heads / a.n_kv_heads);
  const int tid = tid_all % (kWarps * 32), warp = tid >> 5, lane = tid & 31, g = lane >> 2,
            t4 = lane & 3;
  // Without spans the longest (latest) query tiles first; spans list theirs in that order.
  PrefillSpan sp;
  int q0;
  if (!prefill_tile(a, a.spans ? (int)blockIdx.x : (int)(gridDim.x - 1 - blockIdx.x), kBQ, sp, q0))
    return;
  const int n_keys = sp.start + min(q0 + kBQ, sp.n_tokens);
  const int wq0 = q0 + 16 * warp;                              // this warp's first query row
  const int r0 = wq0 + g, r1 = r0 + 8;                         // this lane's two rows
  const int wmax = sp.start + min(wq0 + 15, sp.n_tokens - 1);  // last key any row of the warp sees
  const bool warp_live = wq0 < sp.n_tokens;
  // Sliding window: key tiles from the block's first query's window on; the warp skips tiles
  // before its first row's window, and each row masks keys at or below pos - window.
  const int win = a.window;
  const int kfirst = win > 0 ? max(0, sp.start + q0 - win + 1) / KT * KT : 0;
  // Key splits (gridDim.z > 1): split z takes whole tiles [kbeg, kend) of [kfirst, n_keys) and
  // leaves its unnormalized partial result for attention_merge_kernel.
  const int per = ((n_keys - kfirst + KT - 1) / KT + gridDim.z - 1) / gridDim.z;
  const int kbeg = kfirst + (int)blockIdx.z * per * KT;
  const int kend = min(n_keys, kbeg + per * KT);
  const int wlo = win > 0 ? sp.start + wq0 - win + 1 : 0;

  pdl_wait();  // q and the cache come from the QKV GEMM
  pdl_trigger();

  // K/V tile loads. fp16 cache: cp.async straight into shared memory (zero-fill past the last
  // key). fp32 cache: float4 loads into registers one tile ahead, converted to fp16 on the store;
  // wide heads: cp.async into the fp32 staging tile, converted to the fp16 tile after it lands.
  constexpr int kPer = (KT * kChunks) / (kWarps * 32);  // 8-element slices per thread per tile
  static_assert((KT * kChunks) % (kWarps * 32) == 0, "tile slices must split evenly");
  float4 pre[kHalf || kWide ? 1 : kPer][4];  // fp32 path: k lo/hi, v lo/hi of each slice
  auto slice = [&](int it, int k0, int& j, int& d, bool& ok) {
    const int i = tid + kWarps * 32 * it;
    j = i / kChunks, d = (i % kChunks) * 8;
    ok = k0 + j < n_keys;
    return (size_t)(ok ? key_row(a, sp, k0 + j) : 0) * kv_dim + kvh * HD + d;
  };
  auto issue = [&](int stage, int k0) {
    if constexpr (kHalf) {
#pragma unroll
      for (int it = 0; it < kPer; ++it) {
        int j, d;
        bool ok;
        const size_t off = slice(it, k0, j, d, ok);
        cp_async16(&Ks(stage)[j * P + d], kc + off, ok ? 16 : 0);
        cp_async16(&Vs(stage)[j * P + d], vc + off, ok ? 16 : 0);
      }
      cp_async_commit();
    } else if constexpr (kWide) {
#pragma unroll
      for (int it = 0; it < 2 * kPer; ++it) {  // 4-float slices
        const int i = tid + kWarps * 32 * it, j = i / (HD / 4), d = (i % (HD / 4)) * 4;
        const bool ok = k0 + j < n_keys;
        const size_t off = (size_t)(ok ? key_row(a, sp, k0 + j) : 0) * kv_dim + kvh * HD + d;
        cp_async16(stg + j * HD + d, kc + off, ok ? 16 : 0);
        cp_async16(stg + (KT + j) * HD + d, vc + off, ok ? 16 : 0);
      }
      cp_async_commit();
      (void)stage;  // one staging tile
    } else {
#pragma unroll
      for (int it = 0; it < kPer; ++it) {
        int j, d;
        bool ok;
        const size_t off = slice(it, k0, j, d, ok);
        const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
        const float4* kp = reinterpret_cast<const float4*>(kc + off);
        const float4* vp = reinterpret_cast<const float4*>(vc + off);
        pre[it][0] = ok ? kp[0] : z, pre[it][1] = ok ? kp[1] : z;
        pre[it][2] = ok ? vp[0] : z, pre[it][3] = ok ? vp[1] : z;
      }
    }
  };
  // fp32 path: registers (or the staging tile) -> the fp16 shared tile of that stage
  auto put = [&](int stage) {
    if constexpr (kWide && !kHalf) {
#pragma unroll
      for (int it = 0; it < 2 * kPer; ++it) {
        const int i = tid + kWarps * 32 * it, j = i / (HD / 4), d = (i % (HD / 4)) * 4;
        const float4 kx = *reinterpret_cast<const float4*>(stg + j * HD + d);
        const float4 vx = *reinterpret_cast<const float4*>(stg + (KT + j) * HD + d);
        *reinterpret_cast<uint2*>(&Ks(stage)[j * P + d]) =
            make_uint2(pack_half2(kx.x, kx.y), pack_half2(kx.z, kx.w));
        *reinterpret_cast<uint2*>(&Vs(stage)[j * P + d]) =
            make_uint2(pack_half2(vx.x, vx.y), pack_half2(vx.z, vx.w));
      }
    } else if constexpr (!kHalf) {
#pragma unroll
      for (int it = 0; it < kPer; ++it) {
        const int i = tid + kWarps * 32 * it, j = i / kChunks, d = (i % kChunks) * 8;
        const float4 a0 = pre[it][0], a1 = pre[it][1], b0 = pre[it][2], b1 = pre[it][3];
        *reinterpret_cast<uint4*>(&Ks(stage)[j * P + d]) =
            make_uint4(pack_half2(a0.x, a0.y), pack_half2(a0.z, a0.w), pack_half2(a1.x, a1.y),
                       pack_half2(a1.z, a1.w));
        *reinterpret_cast<uint4*>(&Vs(stage)[j * P + d]) =
            make_uint4(pack_half2(b0.x, b0.y), pack_half2(b0.z, b0.w), pack_half2(b1.x, b1.y),
                       pack_half2(b1.z, b1.w));
      }
    }
  };
  if (kbeg + kg * KT < kend) issue(0, kbeg + kg * KT);

  // Query fragments (A operand, row-major 16 x HD), pre-scaled by log2(e) * scale: in registers,
  // or (wide heads) the block's 64 x HD tile in shared memory (visible after the loop's first
  // barrier).
  uint32_t qf[kWide ? 1 : KC][4];
  if constexpr (kWide) {
    for (int i = tid; i < kBQ * HD / 4; i += kWarps * 32) {
      const int row = i / (HD / 4), d = (i % (HD / 4)) * 4;
      float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
      if (q0 + row < sp.n_tokens)
        x = *reinterpret_cast<const float4*>(a.q + (size_t)(sp.row0 + q0 + row) * a.ldq + h * HD +
                                             d);
      *reinterpret_cast<uint2*>(&Qs[row * P + d]) = make_uint2(
          pack_half2(x.x * qscale, x.y * qscale), pack_half2(x.z * qscale, x.w * qscale));
    }
  } else {
    const float* qa = a.q + (size_t)(sp.row0 + r0) * a.ldq + h * HD;
    const float* qb = a.q + (size_t)(sp.row0 + r1) * a.ldq + h * HD;
    const bool va = r0 < sp.n_tokens, vb = r1 < sp.n_tokens;
#pragma unroll
    for (int c = 0; c < KC; ++c) {
      const int d0 = 16 * c + 2 * t4, d1 = d0 + 8;
      float2 x0 = make_float2(0.f, 0.f), x1 = x0, y0 = x0, y1 = x0;
      if (va)
        x0 = *reinterpret_cast<const float2*>(qa + d0),
        x1 = *reinterpret_cast<const float2*>(qa + d1);
      if (vb)
        y0 = *reinterpret_cast<const float2*>(qb + d0),
        y1 = *reinterpret_cast<const float2*>(qb + d1);
      qf[c][0] = pack_half2(x0.x * qscale, x0.y * qscale);
      qf[c][1] = pack_half2(y0.x * qscale, y0.y * qscale);
      qf[c][2] = pack_half2(x1.x * qscale, x1.y * qscale);
      qf[c][3] = pack_half2(y1.x * qscale, y1.y * qscale);
    }
  }
  const int qpos0 = sp.start + r0, qpos1 = sp.start + r1;
  const int lo0 = win > 0 ? qpos0 - win : -1, lo1 = win > 0 ? qpos1 - win : -1;
  float o[DT][4];
#pragma unroll
  for (int i = 0; i < DT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // l: this lane's partial row sums

  int stage = 0;
  for (int k0 = kbeg + kg * KT; k0 < kend; k0 += KS * KT, stage ^= 1) {
    if constexpr (kHalf) {
      if (k0 + KS * KT < kend) {
        issue(stage ^ 1, k0 + KS * KT);
        cp_async_wait<1>();  // this tile landed, the next one may still be in flight
      } else {
        cp_async_wait<0>();
      }
    } else if constexpr (kWide) {
      cp_async_wait<0>();
      group_sync();  // every thread's copies landed, the last tile's math is done
      put(0);        // the one fp16 tile
      group_sync();
      if (k0 + KT < kend) issue(0, k0 + KT);  // the staging tile is free again
    } else {
      put(stage);
      if (k0 + KS * KT < kend) issue(stage ^ 1, k0 + KS * KT);  // in flight during the math
    }
    if constexpr (!(kWide && !kHalf)) group_sync();  // (the wide fp32 path synced after put)
    const int cur = L::kStages == 1 ? 0 : stage;
    // tiles wholly above the diagonal or before the window: nothing to add
    if (warp_live && k0 <= wmax && k0 + KT > wlo) {
      const __half* ks = Ks(cur);
      float s[NTK][4];
#pragma unroll
      for (int nt = 0; nt < NTK; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
      for (int c = 0; c < KC; ++c) {
        uint32_t qa[4];
        if constexpr (kWide) {
          ldmatrix_x4(qa, Qs + (16 * warp + (lane & 15)) * P + 16 * c + (lane >> 4) * 8);
        } else {
          qa[0] = qf[c][0], qa[1] = qf[c][1], qa[2] = qf[c][2], qa[3] = qf[c][3];
        }
#pragma unroll
        for (int nt = 0; nt < NTK; ++nt) {
          const __half* krow = ks + (nt * 8 + g) * P + 2 * t4 + 16 * c;
          const uint32_t b0 = *reinterpret_cast<const uint32_t*>(krow);
          const uint32_t b1 = *reinterpret_cast<const uint32_t*>(krow + 8);
          mma16816(s[nt], qa, b0, b1);
        }
      }
      float mt0 = -INFINITY, mt1 = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < NTK; ++nt) {
        const int kp = k0 + nt * 8 + 2 * t4;
        if (kp > qpos0 || kp <= lo0) s[nt][0] = -INFINITY;
        if (kp + 1 > qpos0 || kp + 1 <= lo0) s[nt][1] = -INFINITY;
        if (kp > qpos1 || kp <= lo1) s[nt][2] = -INFINITY;
        if (kp + 1 > qpos1 || kp + 1 <= lo1) s[nt][3] = -INFINITY;
        mt0 = fmaxf(mt0, fmaxf(s[nt][0], s[nt][1]));
        mt1 = fmaxf(mt1, fmaxf(s[nt][2], s[nt][3]));
      }
#pragma unroll
      for (int off = 1; off < 4; off <<= 1) {  // the 4 lanes of a quad share a row
        mt0 = fmaxf(mt0, __shfl_xor_sync(0xffffffffu, mt0, off));
        mt1 = fmaxf(mt1, __shfl_xor_sync(0xffffffffu, mt1, off));
      }
      const float mn0 = fmaxf(m0, mt0), mn1 = fmaxf(m1, mt1);
      const float ref0 = mn0 == -INFINITY ? 0.f : mn0;  // fully masked row: keep NaN out
      const float ref1 = mn1 == -INFINITY ? 0.f : mn1;
      const float al0 = exp2f(m0 - ref0), al1 = exp2f(m1 - ref1);
      m0 = mn0, m1 = mn1;
      l0 *= al0, l1 *= al1;
#pragma unroll
      for (int i = 0; i < DT; ++i) o[i][0] *= al0, o[i][1] *= al0, o[i][2] *= al1, o[i][3] *= al1;
      uint32_t pf[NTK / 2][4];  // P as the A operand of P*V: 16 rows x KT keys, chunks of 16
#pragma unroll
      for (int nt = 0; nt < NTK; ++nt) {
        const float p0 = exp2f(s[nt][0] - ref0), p1 = exp2f(s[nt][1] - ref0);
        const float p2 = exp2f(s[nt][2] - ref1), p3 = exp2f(s[nt][3] - ref1);
        l0 += p0 + p1, l1 += p2 + p3;
        pf[nt >> 1][(nt & 1) * 2 + 0] = pack_half2(p0, p1);
        pf[nt >> 1][(nt & 1) * 2 + 1] = pack_half2(p2, p3);
      }
      const __half* vs = Vs(cur);
#pragma unroll
      for (int kk = 0; kk < NTK / 2; ++kk) {
#pragma unroll
        for (int dt = 0; dt < DT; dt += 2) {
          // lanes 0-15: keys kk*16 + (lane&15) at columns dt*8; lanes 16-31: columns (dt+1)*8
          uint32_t b[4];
          ldmatrix_x4_trans(b, vs + (kk * 16 + (lane & 15)) * P + (dt + (lane >> 4)) * 8);
          mma16816(o[dt], pf[kk], b[0], b[1]);
          mma16816(o[dt + 1], pf[kk], b[2], b[3]);
        }
      }
    }
    // This stage is refilled by the next iteration's issue() (the wide fp32 path's next put
    // waits at its first barrier instead).
    if constexpr (!(kWide && !kHalf)) group_sync();
  }
  if constexpr (KS > 1) {
    // Merge: groups 1.. leave (m, l, O) per lane in shared memory (over the dead K/V tiles of
    // group 0); group 0 rescales both to the common max and adds.
    constexpr int kW = 4 * DT + 4;  // floats per lane
    if constexpr (kHalf) cp_async_wait<0>();
    __syncthreads();
    float* xs = reinterpret_cast<float*>(smem_raw);
    for (int gsrc = 1; gsrc < KS; ++gsrc) {
      if (kg == gsrc) {
        float* p = xs + (size_t)tid * kW;
#pragma unroll
        for (int i = 0; i < DT; ++i)
          p[4 * i] = o[i][0], p[4 * i + 1] = o[i][1], p[4 * i + 2] = o[i][2],
                p[4 * i + 3] = o[i][3];
        p[4 * DT] = m0, p[4 * DT + 1] = m1, p[4 * DT + 2] = l0, p[4 * DT + 3] = l1;
      }
      __syncthreads();
      if (kg == 0) {
        const float* p = xs + (size_t)tid * kW;
        const float mb0 = p[4 * DT], mb1 = p[4 * DT + 1];
        const float mn0 = fmaxf(m0, mb0), mn1 = fmaxf(m1, mb1);
        const float ref0 = mn0 == -INFINITY ? 0.f : mn0, ref1 = mn1 == -INFINITY ? 0.f : mn1;
        const float sa0 = exp2f(m0 - ref0), sb0 = exp2f(mb0 - ref0);
        const float sa1 = exp2f(m1 - ref1), sb1 = exp2f(mb1 - ref1);
#pragma unroll
        for (int i = 0; i < DT; ++i) {
          o[i][0] = o[i][0] * sa0 + p[4 * i] * sb0, o[i][1] = o[i][1] * sa0 + p[4 * i + 1] * sb0;
          o[i][2] = o[i][2] * sa1 + p[4 * i + 2] * sb1;
          o[i][3] = o[i][3] * sa1 + p[4 * i + 3] * sb1;
        }
        l0 = l0 * sa0 + p[4 * DT + 2] * sb0, l1 = l1 * sa1 + p[4 * DT + 3] * sb1;
        m0 = mn0, m1 = mn1;
      }
      __syncthreads();
    }
    if (kg != 0) return;
  }
#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
  }
  if (gridDim.z > 1) {  // partial: O unnormalized, then the row's max and sum (log2 domain)
    const size_t pitch = (size_t)(HD + 2);
    const size_t z0 = (size_t)blockIdx.z * a.n_tokens + sp.row0;
    float* p0 = a.partials + ((z0 + r0) * a.n_heads + h) * pitch;
    float* p1 = a.partials + ((z0 + r1) * a.n_heads + h) * pitch;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      const int col = dt * 8 + 2 * t4;
      if (r0 < sp.n_tokens) *reinterpret_cast<float2*>(p0 + col) = make_float2(o[dt][0], o[dt][1]);
      if (r1 < sp.n_tokens) *reinterpret_cast<float2*>(p1 + col) = make_float2(o[dt][2], o[dt][3]);
    }
    if (t4 == 0 && r0 < sp.n_tokens) p0[HD] = m0, p0[HD + 1] = l0;
    if (t4 == 0 && r1 < sp.n_tokens) p1[HD] = m1, p1[HD + 1] = l1;
    return;
  }
  const float inv0 = 1.f / l0, inv1 = 1.f / l1;
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) {
    const int col = h * HD + dt * 8 + 2 * t4;
    if (r0 < sp.n_tokens)
      store_out2(a.out, a.out_h, (size_t)(sp.row0 + r0) * a.ldo + col, o[dt][0] * inv0,
                 o[dt][1] * inv0);
    if (r1 < sp.n_tokens)
      store_out2(a.out, a.out_h, (size_t)(sp.row0 + r1) * a.ldo + col, o[dt][2] * inv1,
                 o[dt][3] * inv1);
  }
}

// Combines the key splits of each (row, head): out = sum_z 2^(m_z - M) O_z / sum_z 2^(m_z - M) l_z.
// One block per (query, head): query x of the rows, or with spans query x % kBQ of tile x / kBQ.
__global__ void attention_merge_kernel(AttentionPrefillArgs a, int n_split) {
  const int h = blockIdx.y, d = threadIdx.x, hd = a.head_dim;
  pdl_wait();
  pdl_trigger();
  int row = blockIdx.x;
  if (a.spans) {
    PrefillSpan sp;
    int q0;
    const int i = (int)blockIdx.x % kBQ;
    if (!prefill_tile(a, (int)blockIdx.x / kBQ, kBQ, sp, q0) || q0 + i >= sp.n_tokens) return;
    row = sp.row0 + q0 + i;
  }
  const size_t pitch = (size_t)(hd + 2), zstride = (size_t)a.n_tokens * a.n_heads * pitch;
  float mm = -INFINITY, l = 0.f, o = 0.f;
  merge_partials<kAttnPrefillSplits>(a.partials + ((size_t)row * a.n_heads + h) * pitch, n_split,
                                     zstride, hd, d, mm, l, o);
  store_out(a.out, a.out_h, (size_t)row * a.ldo + h * hd + d, o / l);
}

template <int HD, class KV, int KS, int KT = kKT>
void launch_ks(const AttentionPrefillArgs& a, const Launch& s, int n_split = 1) {
  constexpr size_t bytes = TcSmem<HD, KV, KS, KT>::bytes;
  static_assert(bytes <= kMaxBlockSmem && KS <= 2, "tile set exceeds shared memory");
  static bool configured = false;
  if (!configured) {
    configure_prefill_kernel(attention_prefill_tc_kernel<HD, KV, KS, KT>, (int)bytes);
    configured = true;
  }
  // log2(e) * scale (exp2 softmax); the default scale is 1/sqrt(head_dim)
  const float qscale = 1.4426950408889634f * (a.scale > 0.f ? a.scale : 1.f / sqrtf((float)HD));
  const int tiles = a.spans ? a.max_tiles : (a.n_tokens + kBQ - 1) / kBQ;
  launch_kernel(attention_prefill_tc_kernel<HD, KV, KS, KT>,
                dim3((unsigned)tiles, (unsigned)a.n_heads, (unsigned)n_split),
                dim3(kWarps * 32 * KS), bytes, s, a, qscale);
  if (n_split > 1)
    launch_kernel(attention_merge_kernel,
                  dim3((unsigned)(a.spans ? tiles * kBQ : a.n_tokens), (unsigned)a.n_heads),
                  dim3(HD), 0, s, a, n_split);
}

template <int HD>
void launch_tc(const AttentionPrefillArgs& a, const Launch& s) {
  static_assert(HD % 16 == 0 && (HD / 8) % 2 == 0, "head_dim must be a multiple of 16");
  if constexpr (HD > 64) {
    // Wide heads: 32-key tiles, one key group (a block's shared memory fills most of an SM), so
    // the keys split over up to kAttnPrefillSplits blocks when the query tiles alone would leave
    // SMs idle (a 512-token gemma3 prompt makes 32 blocks without: latency-bound, 1 warp per
    // scheduler).
    // (Spans' keys are known only on the device: as many splits as the grid leaves room for.)
    const int blocks = (a.spans ? a.max_tiles : (a.n_tokens + kBQ - 1) / kBQ) * a.n_heads;
    const int all = a.spans ? INT_MAX / 2 : a.start + a.n_tokens;
    const int keys = a.window > 0 ? std::min(all, a.window + kBQ + 32) : all;
    int n_split =
        a.partials ? std::min({kAttnPrefillSplits, sm_count() / blocks, (keys + 31) / 32}) : 1;
    n_split = std::max(n_split, 1);
    a.kv_half ? launch_ks<HD, __half, 1, 32>(a, s, n_split)
              : launch_ks<HD, float, 1, 32>(a, s, n_split);
  } else {
    bool done = false;
    if constexpr ((32 * HD / 8) % (kWarps * 32) == 0) {
      // Every key in one 32-key tile (short prompts from the start): half the tile loads and
      // math of a 64-key tile, most of it zero-filled and masked.
      if (!a.spans && a.start + a.n_tokens <= 32) {
        a.kv_half ? launch_ks<HD, __half, 1, 32>(a, s) : launch_ks<HD, float, 1, 32>(a, s);
        done = true;
      }
    }
    // Two key groups once there are 2+ key tiles (spans: the chunks they serve mostly have).
    if (!done && (a.spans || a.start + a.n_tokens > kKT)) {
      a.kv_half ? launch_ks<HD, __half, 2>(a, s) : launch_ks<HD, float, 2>(a, s);
    } else if (!done) {
      a.kv_half ? launch_ks<HD, __half, 1>(a, s) : launch_ks<HD, float, 1>(a, s);
    }
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool attention_prefill_tc(const AttentionPrefillArgs& a, const Launch& s) {
  switch (a.head_dim) {
    case 16:
      return launch_tc<16>(a, s), true;
    case 32:
      return launch_tc<32>(a, s), true;
    case 64:
      return launch_tc<64>(a, s), true;
    case 128:
      return launch_tc<128>(a, s), true;
    case 256:
      return launch_tc<256>(a, s), true;
    default:
      return false;
  }
}

}  // namespace smolrt::cuda::detail
