// Small-batch multi-token GEMM (SIMT, fp32 math). Each weight block is read once per 8 tokens and
// used for all of them: for t <= 8 that is one pass over the weights, the point of batching when
// the GEMM is memory/latency-bound. 4 lanes per quant block, 8 weights each.
#include "core/cuda_check.h"
#include "cuda/gemm_common.cuh"
#include "cuda/launch.cuh"

namespace smolrt::cuda::detail {
namespace {

constexpr int kNT = 8;     // tokens per pass
constexpr int kRows = 4;   // rows per block (two aligned pairs, for the pair epilogues)
constexpr int kWarps = 4;  // warps per block, each on a quarter of the K blocks

// Block = 4 rows x all K; its 4 warps split the K blocks (lane groups of 4 per quant block), so
// a row's weights are fetched by 32 lane groups at once: one memory round trip for K <= 1024
// instead of K/256 dependent ones. Partial sums meet in shared memory.
template <class B, GemmEpilogue E>
__global__ void __launch_bounds__(128) gemm_small_kernel(GemmArgs a, GemmOut o) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row0 = blockIdx.x * kRows;
  const int nb = a.k / 32;
  const size_t rb = (size_t)nb * sizeof(B);
  const int s = lane & 3;
  __shared__ float red[kWarps][(kRows + 1) * kNT];

  pdl_wait();  // x (and the residual y) come from the previous kernel
  pdl_trigger();

  for (int t0 = 0; t0 < a.t; t0 += kNT) {
    const int nt = min(kNT, a.t - t0);
    // RMSNorm sums of squares ride along: the block's lanes read every x element exactly once.
    float acc[kRows + 1][kNT];  // row kRows: sum of squares per token
#pragma unroll
    for (int r = 0; r <= kRows; ++r)
#pragma unroll
      for (int tt = 0; tt < kNT; ++tt) acc[r][tt] = 0.f;

    for (int b = (lane >> 2) + 8 * warp; b < nb; b += 8 * kWarps) {
      float q[kRows][8], d[kRows];
      int k0 = 0, k1 = 0;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (row0 + r < a.n) {
          const B* w =
              reinterpret_cast<const B*>(static_cast<const char*>(a.w) + (size_t)(row0 + r) * rb);
          d[r] = WBlock<B>::load8(w + b, s, q[r], k0, k1);
        } else {
          d[r] = 0.f;
#pragma unroll
          for (int j = 0; j < 8; ++j) q[r][j] = 0.f;
        }
      }
      const int kb = b * 32;
      if (a.norm_w) {  // fold the norm weight into the (per-lane) weights
        const float4 na = __ldg(reinterpret_cast<const float4*>(a.norm_w + kb + k0));
        const float4 nc = __ldg(reinterpret_cast<const float4*>(a.norm_w + kb + k1));
        const float nw[8] = {na.x, na.y, na.z, na.w, nc.x, nc.y, nc.z, nc.w};
#pragma unroll
        for (int r = 0; r < kRows; ++r)
#pragma unroll
          for (int j = 0; j < 8; ++j) q[r][j] *= nw[j];
      }
#pragma unroll
      for (int tt = 0; tt < kNT; ++tt) {
        if (tt < nt) {
          const float* xr = a.x + (size_t)(t0 + tt) * a.ldx + kb;
          const float4 xa = __ldg(reinterpret_cast<const float4*>(xr + k0));
          const float4 xb = __ldg(reinterpret_cast<const float4*>(xr + k1));
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            const float sr = q[r][0] * xa.x + q[r][1] * xa.y + q[r][2] * xa.z + q[r][3] * xa.w +
                             q[r][4] * xb.x + q[r][5] * xb.y + q[r][6] * xb.z + q[r][7] * xb.w;
            acc[r][tt] = fmaf(d[r], sr, acc[r][tt]);
          }
          if (a.norm_w)
            acc[kRows][tt] += xa.x * xa.x + xa.y * xa.y + xa.z * xa.z + xa.w * xa.w + xb.x * xb.x +
                              xb.y * xb.y + xb.z * xb.z + xb.w * xb.w;
        }
      }
    }
#pragma unroll
    for (int r = 0; r <= kRows; ++r)
#pragma unroll
      for (int tt = 0; tt < kNT; ++tt) {
        if (tt < nt && (r < kRows || a.norm_w)) {  // warp-uniform: skip idle token slots
          float v = acc[r][tt];
#pragma unroll
          for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
          if (lane == 0) red[warp][r * kNT + tt] = v;
        }
      }
    __syncthreads();
    if (threadIdx.x < (kRows / 2) * kNT) {
      const int p = threadIdx.x / kNT, tt = threadIdx.x % kNT;
      const int row = row0 + 2 * p;
      if (tt < nt && row < a.n) {
        float v0 = 0.f, v1 = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
          v0 += red[w][(2 * p) * kNT + tt];
          v1 += red[w][(2 * p + 1) * kNT + tt];
        }
        float sc = 1.f;
        if (a.norm_w) {
          float ssum = 0.f;
#pragma unroll
          for (int w = 0; w < kWarps; ++w) ssum += red[w][kRows * kNT + tt];
          sc = rsqrtf(ssum / (float)a.k + a.eps);
        }
        epi_pair<E>(o, a.n, t0 + tt, row, v0 * sc, v1 * sc);
      }
    }
    __syncthreads();  // red is reused by the next pass
  }
}

}  // namespace

template <class B, GemmEpilogue E>
void launch_gemm_small(const GemmArgs& a, const GemmOut& o, cudaStream_t s) {
  const dim3 grid((unsigned)((a.n + kRows - 1) / kRows));
  launch_pdl(gemm_small_kernel<B, E>, grid, dim3(32 * kWarps), s, a, o);
}

template void launch_gemm_small<BlockQ4_0, GemmEpilogue::Store>(const GemmArgs&, const GemmOut&,
                                                                cudaStream_t);
template void launch_gemm_small<BlockQ4_0, GemmEpilogue::Accumulate>(const GemmArgs&,
                                                                     const GemmOut&, cudaStream_t);
template void launch_gemm_small<BlockQ4_0, GemmEpilogue::SiluPair>(const GemmArgs&, const GemmOut&,
                                                                   cudaStream_t);
template void launch_gemm_small<BlockQ4_0, GemmEpilogue::QkvRope>(const GemmArgs&, const GemmOut&,
                                                                  cudaStream_t);
template void launch_gemm_small<BlockQ8_0, GemmEpilogue::Store>(const GemmArgs&, const GemmOut&,
                                                                cudaStream_t);

}  // namespace smolrt::cuda::detail
