// Small-batch multi-token GEMM (SIMT, fp32 math). A warp owns an aligned row pair (2r, 2r+1) so
// the pair epilogues (RoPE, SiLU*up) stay in registers; its lanes stride over the K blocks, 4
// lanes per block, 8 weights each. Each weight block is read once per 8 tokens: for t <= 8 that is
// one pass over the weights, the whole point of batching when the GEMM is memory-bound.
#include "core/cuda_check.h"
#include "cuda/gemm_common.cuh"

namespace smolrt::cuda::detail {
namespace {

constexpr int kNT = 8;  // tokens per pass (registers: 2 rows x 8 tokens of accumulators)

template <class B, GemmEpilogue E>
__global__ void __launch_bounds__(128) gemm_small_kernel(GemmArgs a, GemmOut o) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * 4 + warp) * 2;
  const int nb = a.k / 32;
  const size_t rb = (size_t)nb * sizeof(B);
  const bool has0 = row0 < a.n, has1 = row0 + 1 < a.n;
  const B* w0 = reinterpret_cast<const B*>(static_cast<const char*>(a.w) + (size_t)row0 * rb);
  const B* w1 = reinterpret_cast<const B*>(static_cast<const char*>(a.w) + (size_t)(row0 + 1) * rb);
  const int s = lane & 3;
  __shared__ float rs[kNT];

  for (int t0 = 0; t0 < a.t; t0 += kNT) {
    const int nt = min(kNT, a.t - t0);
    if (a.norm_w) {
      __syncthreads();  // the previous pass's readers of rs are done
      for (int tt = warp; tt < nt; tt += 4) {
        const float r = warp_rms_scale(a.x + (size_t)(t0 + tt) * a.ldx, a.k, a.eps);
        if (lane == 0) rs[tt] = r;
      }
      __syncthreads();
    }
    float acc0[kNT], acc1[kNT];
#pragma unroll
    for (int tt = 0; tt < kNT; ++tt) acc0[tt] = acc1[tt] = 0.f;

    if (has0) {
      for (int b = lane >> 2; b < nb; b += 8) {
        float q0[8], q1[8];
        int k0, k1;
        const float d0 = WBlock<B>::load8(w0 + b, s, q0, k0, k1);
        float d1 = 0.f;
        if (has1) {
          d1 = WBlock<B>::load8(w1 + b, s, q1, k0, k1);
        } else {
#pragma unroll
          for (int j = 0; j < 8; ++j) q1[j] = 0.f;
        }
        const int kb = b * 32;
        if (a.norm_w) {  // fold the norm weight into the (per-lane) weights
          const float4 na = *reinterpret_cast<const float4*>(a.norm_w + kb + k0);
          const float4 nb4 = *reinterpret_cast<const float4*>(a.norm_w + kb + k1);
          const float nw[8] = {na.x, na.y, na.z, na.w, nb4.x, nb4.y, nb4.z, nb4.w};
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            q0[j] *= nw[j];
            q1[j] *= nw[j];
          }
        }
#pragma unroll
        for (int tt = 0; tt < kNT; ++tt) {
          if (tt < nt) {
            const float* xr = a.x + (size_t)(t0 + tt) * a.ldx + kb;
            const float4 xa = __ldg(reinterpret_cast<const float4*>(xr + k0));
            const float4 xb = __ldg(reinterpret_cast<const float4*>(xr + k1));
            const float s0 = q0[0] * xa.x + q0[1] * xa.y + q0[2] * xa.z + q0[3] * xa.w +
                             q0[4] * xb.x + q0[5] * xb.y + q0[6] * xb.z + q0[7] * xb.w;
            const float s1 = q1[0] * xa.x + q1[1] * xa.y + q1[2] * xa.z + q1[3] * xa.w +
                             q1[4] * xb.x + q1[5] * xb.y + q1[6] * xb.z + q1[7] * xb.w;
            acc0[tt] = fmaf(d0, s0, acc0[tt]);
            acc1[tt] = fmaf(d1, s1, acc1[tt]);
          }
        }
      }
    }
#pragma unroll
    for (int tt = 0; tt < kNT; ++tt) {
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        acc0[tt] += __shfl_xor_sync(0xffffffffu, acc0[tt], off);
        acc1[tt] += __shfl_xor_sync(0xffffffffu, acc1[tt], off);
      }
    }
    if (has0) {
#pragma unroll
      for (int tt = 0; tt < kNT; ++tt) {
        if (lane == tt && tt < nt) {
          const float sc = a.norm_w ? rs[tt] : 1.f;
          epi_pair<E>(o, a.n, t0 + tt, row0, acc0[tt] * sc, acc1[tt] * sc);
        }
      }
    }
  }
}

}  // namespace

template <class B, GemmEpilogue E>
void launch_gemm_small(const GemmArgs& a, const GemmOut& o, cudaStream_t s) {
  const int rows_per_block = 8;  // 4 warps x 2 rows
  const dim3 grid((unsigned)((a.n + rows_per_block - 1) / rows_per_block));
  gemm_small_kernel<B, E><<<grid, 128, 0, s>>>(a, o);
  CUDA_CHECK_LAUNCH();
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
