// Tensor-core causal GQA attention for prefill (FlashAttention-2 style), fp16 or fp32 KV cache
// (staged in shared memory as fp16 either way), head_dim 16/32/64. A 128-thread block owns 64
// queries of one head: each warp 16 query rows, their scores and output stay in mma.sync m16n8k16
// register fragments (fp16 operands, fp32 accumulate). K/V tiles of 64 keys (32 when the whole
// context fits in one) stream through shared memory with cp.async, double-buffered so the next
// tile's loads are in flight during this tile's math (the SIMT kernel was shared-memory-bound: 4
// FMAs per shared load; here one ldmatrix feeds 2 MMAs of 256 FMAs each). The score fragment (C
// layout) is re-packed in registers as the A operand of P*V, so P never touches shared memory.
// Query, K, V and P are rounded to fp16 (scores/sums/output stay fp32).
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "core/cuda_check.h"
#include "cuda/attention_prefill.h"
#include "cuda/launch.cuh"

namespace smolrt::cuda::detail {
namespace {

constexpr int kWarps = 4, kBQ = 16 * kWarps, kKT = 64;

// Two 8x8 fp16 matrices transposed out of shared memory per call pair: the B operand (k = key,
// n = head dim) of two adjacent 8-wide output column tiles.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

// KS key groups of 4 warps each: group g takes key tiles g, g+KS, ... for the same 64 queries
// (halves the serial tile chain of the longest query tile at KS=2); the partial (m, l, O) of
// the groups merge through shared memory at the end.
template <int HD, class KV, int KS, int KT>
__global__ void __launch_bounds__(kWarps * 32 * KS)
    attention_prefill_tc_kernel(AttentionPrefillArgs a, float qscale) {
  static_assert(KT == 32 || KT == 64, "key tiles of 32 or 64");
  constexpr int NTK = KT / 8;  // 8-key score tiles per key tile
  constexpr int P = HD + 8;    // fp16 row pitch: +16 B puts the 8 rows of a fragment in distinct
                               // banks (both for the 32-bit K reads and for ldmatrix on V)
  constexpr int KC = HD / 16;  // 16-wide k chunks of the QK^T product
  constexpr int DT = HD / 8;   // 8-wide output column tiles
  constexpr int kChunks = HD / 8;                             // 16-byte chunks per K/V row
  extern __shared__ __align__(128) unsigned char smem_raw[];  // [KS][2 stages][K, V][KT * P]
  const int tid_all = threadIdx.x, kg = tid_all / (kWarps * 32);
  __half* gbase = reinterpret_cast<__half*>(smem_raw) + (size_t)kg * 4 * KT * P;
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
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kBQ;  // longest (latest) query tiles first
  const int tid = tid_all % (kWarps * 32), warp = tid >> 5, lane = tid & 31, g = lane >> 2,
            t4 = lane & 3;
  const int n_keys = a.start + min(q0 + kBQ, a.n_tokens);
  const int wq0 = q0 + 16 * warp;                            // this warp's first query row
  const int r0 = wq0 + g, r1 = r0 + 8;                       // this lane's two rows
  const int wmax = a.start + min(wq0 + 15, a.n_tokens - 1);  // last key any row of the warp sees
  const bool warp_live = wq0 < a.n_tokens;

  pdl_wait();  // q and the cache come from the QKV GEMM
  pdl_trigger();

  // K/V tile loads. fp16 cache: cp.async straight into shared memory (zero-fill past the last
  // key). fp32 cache: float4 loads into registers one tile ahead, converted to fp16 on the store.
  constexpr bool kHalf = std::is_same_v<KV, __half>;
  constexpr int kPer = (KT * kChunks) / (kWarps * 32);  // 8-element slices per thread per tile
  static_assert((KT * kChunks) % (kWarps * 32) == 0, "tile slices must split evenly");
  float4 pre[kHalf ? 1 : kPer][4];  // fp32 path: k lo/hi, v lo/hi of each slice
  auto slice = [&](int it, int k0, int& j, int& d, bool& ok) {
    const int i = tid + kWarps * 32 * it;
    j = i / kChunks, d = (i % kChunks) * 8;
    ok = k0 + j < n_keys;
    return (size_t)(ok ? k0 + j : 0) * kv_dim + kvh * HD + d;
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
  auto put = [&](int stage) {  // fp32 path: registers -> fp16 shared tile
    if constexpr (!kHalf) {
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
  issue(0, kg * KT);

  // Query fragments (A operand, row-major 16 x HD), pre-scaled by log2(e)/sqrt(HD).
  uint32_t qf[KC][4];
  {
    const float* qa = a.q + (size_t)r0 * a.ldq + h * HD;
    const float* qb = a.q + (size_t)r1 * a.ldq + h * HD;
    const bool va = r0 < a.n_tokens, vb = r1 < a.n_tokens;
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
  const int qpos0 = a.start + r0, qpos1 = a.start + r1;
  float o[DT][4];
#pragma unroll
  for (int i = 0; i < DT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // l: this lane's partial row sums

  int stage = 0;
  for (int k0 = kg * KT; k0 < n_keys; k0 += KS * KT, stage ^= 1) {
    if constexpr (kHalf) {
      if (k0 + KS * KT < n_keys) {
        issue(stage ^ 1, k0 + KS * KT);
        cp_async_wait<1>();  // this tile landed, the next one may still be in flight
      } else {
        cp_async_wait<0>();
      }
    } else {
      put(stage);
      if (k0 + KS * KT < n_keys) issue(stage ^ 1, k0 + KS * KT);  // in flight during the math
    }
    group_sync();
    if (warp_live && k0 <= wmax) {  // tiles wholly above the diagonal: nothing to add
      const __half* ks = Ks(stage);
      float s[NTK][4];
#pragma unroll
      for (int nt = 0; nt < NTK; ++nt) {
        s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
        const __half* krow = ks + (nt * 8 + g) * P + 2 * t4;
#pragma unroll
        for (int c = 0; c < KC; ++c) {
          const uint32_t b0 = *reinterpret_cast<const uint32_t*>(krow + 16 * c);
          const uint32_t b1 = *reinterpret_cast<const uint32_t*>(krow + 16 * c + 8);
          mma16816(s[nt], qf[c], b0, b1);
        }
      }
      float mt0 = -INFINITY, mt1 = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < NTK; ++nt) {
        const int kp = k0 + nt * 8 + 2 * t4;
        if (kp > qpos0) s[nt][0] = -INFINITY;
        if (kp + 1 > qpos0) s[nt][1] = -INFINITY;
        if (kp > qpos1) s[nt][2] = -INFINITY;
        if (kp + 1 > qpos1) s[nt][3] = -INFINITY;
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
      const __half* vs = Vs(stage);
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
    group_sync();  // this stage is refilled by the next iteration's issue()
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
  const float inv0 = 1.f / l0, inv1 = 1.f / l1;
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) {
    const int col = h * HD + dt * 8 + 2 * t4;
    if (r0 < a.n_tokens)
      *reinterpret_cast<float2*>(a.out + (size_t)r0 * a.ldo + col) =
          make_float2(o[dt][0] * inv0, o[dt][1] * inv0);
    if (r1 < a.n_tokens)
      *reinterpret_cast<float2*>(a.out + (size_t)r1 * a.ldo + col) =
          make_float2(o[dt][2] * inv1, o[dt][3] * inv1);
  }
}

template <int HD, class KV, int KS, int KT = kKT>
void launch_ks(const AttentionPrefillArgs& a, cudaStream_t s) {
  constexpr int bytes = KS * 4 * KT * (HD + 8) * 2;  // KS x 2 stages x (K, V) fp16 tiles
  static_assert(bytes <= 227 * 1024 && KS <= 2, "tile set exceeds shared memory");
  static bool configured = false;
  if (!configured) {
    configure_prefill_kernel(attention_prefill_tc_kernel<HD, KV, KS, KT>, bytes);
    configured = true;
  }
  const float qscale = 1.4426950408889634f / sqrtf((float)HD);  // log2(e)/sqrt(head_dim)
  launch_kernel_pdl(s != nullptr, attention_prefill_tc_kernel<HD, KV, KS, KT>,
                    dim3((unsigned)((a.n_tokens + kBQ - 1) / kBQ), (unsigned)a.n_heads),
                    dim3(kWarps * 32 * KS), (size_t)bytes, s, a, qscale);
}

template <int HD>
void launch_tc(const AttentionPrefillArgs& a, cudaStream_t s) {
  static_assert(HD % 16 == 0 && (HD / 8) % 2 == 0, "head_dim must be a multiple of 16");
  const bool split = a.start + a.n_tokens > kKT;  // two key groups once there are 2+ key tiles
  // Every key in one 32-key tile (short prompts from the start): half the tile loads and math of
  // a 64-key tile, most of it zero-filled and masked.
  if constexpr ((32 * HD / 8) % (kWarps * 32) == 0) {
    if (a.start + a.n_tokens <= 32) {
      a.kv_half ? launch_ks<HD, __half, 1, 32>(a, s) : launch_ks<HD, float, 1, 32>(a, s);
      CUDA_CHECK_LAUNCH();
      return;
    }
  }
  if (a.kv_half) {
    split ? launch_ks<HD, __half, 2>(a, s) : launch_ks<HD, __half, 1>(a, s);
  } else {
    split ? launch_ks<HD, float, 2>(a, s) : launch_ks<HD, float, 1>(a, s);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool attention_prefill_tc(const AttentionPrefillArgs& a, cudaStream_t s) {
  switch (a.head_dim) {
    case 16:
      return launch_tc<16>(a, s), true;
    case 32:
      return launch_tc<32>(a, s), true;
    case 64:
      return launch_tc<64>(a, s), true;
    default:
      return false;
  }
}

}  // namespace smolrt::cuda::detail
