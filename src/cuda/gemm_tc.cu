// Tensor-core multi-token GEMM: a 64-row x BM-token output tile per 256-thread block. Each K step
// (128 = four quant blocks; long steps halve the barrier/latency rounds) dequantizes the weight
// tile to fp16 in shared memory once and reuses it for all BM tokens (WMMA m16n16k16, fp32
// accumulate); the next step's global loads are issued into registers before the current step's
// MMAs so their latency overlaps the math.
#include <mma.h>

#include <algorithm>
#include <cstdlib>

#include "core/cuda_check.h"
#include "cuda/gemm_common.cuh"
#include "cuda/launch.cuh"

namespace smolrt::cuda::detail {
namespace {

using namespace nvcuda;

constexpr int kBN = 64, kBK = 128, kThreads = 256;
constexpr int kLDS = kBK + 8;  // fp16 row pitch: +16 B skews rows across banks, keeps 32 B align
constexpr int kLDC = kBN + 4;  // fp32 pitch of the staged output tile

template <int BM>
struct TcSmem {  // the output tile reuses the operand tiles' space after the K loop
  union {
    struct {
      __half A[BM * kLDS];   // activations [token][k]
      __half B[kBN * kLDS];  // weights [row][k] (= col-major B operand)
    } op;
    float C[BM * kLDC];
  };
  float rs[BM];
};

// MINB: resident blocks per SM the register budget is capped for. MINB=1 keeps the two-step
// register lookahead (181 registers at BM=64: one block per SM); MINB=2 drops to one step of
// lookahead so two blocks fit (the other block hides the latency instead).
template <class B, GemmEpilogue E, int BM, int MINB>
__global__ void __launch_bounds__(kThreads, MINB)
    gemm_tc_kernel(GemmArgs a, GemmOut o, int kchunk) {
  constexpr bool kLook2 = MINB == 1;
  constexpr int FM = BM / 32;                  // 16x16 fragments per warp along tokens
  constexpr int XV = BM * kBK / 4 / kThreads;  // float4 activation loads per thread per K step
  constexpr int WH = WBlock<B>::kHalves;       // one quant block per thread per K step
  __shared__ __align__(128) TcSmem<BM> sm;
  __half* As = sm.op.A;
  __half* Bs = sm.op.B;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int t0 = blockIdx.y * BM, n0 = blockIdx.x * kBN;
  const int nb = a.k / 32;
  const size_t rb = (size_t)nb * sizeof(B);
  // Split-K (Accumulate without norm only): block z covers k in [kbeg, kend).
  const int kbeg = blockIdx.z * kchunk, kend = min(a.k, kbeg + kchunk);
  const bool norm = a.norm_w != nullptr;

  uint2 xa[XV],
      xb[kLook2 ? XV : 1];  // two steps ahead: activations already fp16 (halves the registers)
  float ss[XV];  // RMSNorm: sum of squares of this thread's slice of rows warp + 8j (fused:
                 // the X tile streams through the block anyway, no extra pass over x)
  uint16_t wa[WH], wb[kLook2 ? WH : 1];
  const int wrow = tid >> 2, wblk = tid & 3;  // weight row in the tile, quant block in the step
  const uint16_t* wbase =
      reinterpret_cast<const uint16_t*>(static_cast<const char*>(a.w) + (size_t)(n0 + wrow) * rb);
  const bool wrow_ok = n0 + wrow < a.n;
#pragma unroll
  for (int j = 0; j < XV; ++j) ss[j] = 0.f;

  auto gload = [&](uint2(&xr)[XV], uint16_t(&wr)[WH], int kb) {
#pragma unroll
    for (int j = 0; j < XV; ++j) {
      const int i = tid + kThreads * j, r = i / (kBK / 4), c = (i % (kBK / 4)) * 4;
      const int tok = t0 + r, kk = kb + c;
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (tok < a.t && kk < a.k) {
        v = __ldg(reinterpret_cast<const float4*>(a.x + (size_t)tok * a.ldx + kk));
        if (norm) {
          ss[j] += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
          const float4 w = __ldg(reinterpret_cast<const float4*>(a.norm_w + kk));
          v.x *= w.x, v.y *= w.y, v.z *= w.z, v.w *= w.w;
        }
      }
      __half2 h[2] = {__floats2half2_rn(v.x, v.y), __floats2half2_rn(v.z, v.w)};
      xr[j] = *reinterpret_cast<const uint2*>(h);
    }
    const int blk = kb / 32 + wblk;
    if (wrow_ok && blk < nb) {
      const uint16_t* p = wbase + (size_t)blk * (sizeof(B) / 2);
#pragma unroll
      for (int hh = 0; hh < WH; ++hh) wr[hh] = __ldg(p + hh);
    } else {
#pragma unroll
      for (int hh = 0; hh < WH; ++hh) wr[hh] = 0;  // d = 0 -> zero weights
    }
  };
  auto sstore = [&](const uint2(&xr)[XV], const uint16_t(&wr)[WH]) {
#pragma unroll
    for (int j = 0; j < XV; ++j) {
      const int i = tid + kThreads * j, r = i / (kBK / 4), c = (i % (kBK / 4)) * 4;
      *reinterpret_cast<uint2*>(&As[r * kLDS + c]) = xr[j];
    }
    __half2 w[16];
    WBlock<B>::dequant32(wr, w);
    uint4* dst = reinterpret_cast<uint4*>(&Bs[wrow * kLDS + wblk * 32]);
    const uint4* src = reinterpret_cast<const uint4*>(w);
#pragma unroll
    for (int v = 0; v < 4; ++v) dst[v] = src[v];
  };

  // 8 warps: 2 along tokens (BM/2 each) x 4 along columns (16 each).
  const int wm = warp >> 2, wn = warp & 3;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM];
#pragma unroll
  for (int i = 0; i < FM; ++i) wmma::fill_fragment(acc[i], 0.f);

  pdl_wait();  // x (and the residual y) come from the previous kernel
  pdl_trigger();
  auto mma_step = [&]() {
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
      wmma::load_matrix_sync(fb, &Bs[(wn * 16) * kLDS + kk], kLDS);
#pragma unroll
      for (int i = 0; i < FM; ++i) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
        wmma::load_matrix_sync(fa, &As[(wm * (BM / 2) + i * 16) * kLDS + kk], kLDS);
        wmma::mma_sync(acc[i], fa, fb, acc[i]);
      }
    }
  };
  if constexpr (kLook2) {
    // Two register buffers: the loads for step i+2 are issued at step i, so two global round
    // trips overlap (the math per step is short; one-step lookahead left the latency exposed).
    gload(xa, wa, kbeg);
    if (kbeg + kBK < kend) gload(xb, wb, kbeg + kBK);
    for (int kb = kbeg; kb < kend; kb += 2 * kBK) {
      sstore(xa, wa);
      __syncthreads();
      if (kb + 2 * kBK < kend) gload(xa, wa, kb + 2 * kBK);
      mma_step();
      __syncthreads();
      if (kb + kBK >= kend) break;
      sstore(xb, wb);
      __syncthreads();
      if (kb + 3 * kBK < kend) gload(xb, wb, kb + 3 * kBK);
      mma_step();
      __syncthreads();
    }
  } else {
    gload(xa, wa, kbeg);
    for (int kb = kbeg; kb < kend; kb += kBK) {
      sstore(xa, wa);
      __syncthreads();
      if (kb + kBK < kend) gload(xa, wa, kb + kBK);
      mma_step();
      __syncthreads();
    }
  }
  if (norm) {  // rows warp + 8j: reduce over the 32 lanes (a row is 32 float4 of a K step)
#pragma unroll
    for (int j = 0; j < XV; ++j) {
      float v = ss[j];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0) sm.rs[warp + 8 * j] = rsqrtf(v / (float)a.k + a.eps);
    }
  }
  float* Cs = sm.C;  // operand tiles are dead after the last barrier of the loop
#pragma unroll
  for (int i = 0; i < FM; ++i)
    wmma::store_matrix_sync(&Cs[(wm * (BM / 2) + i * 16) * kLDC + wn * 16], acc[i], kLDC,
                            wmma::mem_row_major);
  __syncthreads();

  store_tile<E, BM, kBN, kLDC, kThreads>(a, o, Cs, sm.rs, norm, t0, n0, tid);
}

int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}

// SMOLRT_GEMM_TC_BM=32|64 pins the token tile (experiments: the 64-token kernel needs 181
// registers, i.e. one 256-thread block per SM; the 32-token one 128, i.e. two). Unset: auto.
int env_int(const char* name) {
  const char* e = std::getenv(name);
  return e ? std::atoi(e) : 0;
}
int forced_bm() {
  static const int v = env_int("SMOLRT_GEMM_TC_BM");
  return v;
}
// SMOLRT_GEMM_TC_OCC=2: the 64-token kernel capped at 128 registers, one-step lookahead, two
// blocks per SM (experiment).
bool occ2() {
  static const bool v = env_int("SMOLRT_GEMM_TC_OCC") == 2;
  return v;
}
// SMOLRT_GEMM_TC_V=1: skip the cp.async pipeline kernel (gemm_pipe.cu), always run this one.
bool legacy() {
  static const bool v = env_int("SMOLRT_GEMM_TC_V") == 1;
  return v;
}

}  // namespace

template <class B, GemmEpilogue E>
void launch_gemm_tc(const GemmArgs& a, const GemmOut& o, cudaStream_t s) {
  if (!legacy() && launch_gemm_pipe<B, E>(a, o, sm_count(), s)) {
    CUDA_CHECK_LAUNCH();
    return;
  }
  const int gn = (a.n + kBN - 1) / kBN;
  const int ksteps = (a.k + kBK - 1) / kBK;
  // 64-token tiles halve the activation re-reads but only when they still fill every SM.
  const bool big =
      forced_bm() == 64 || (forced_bm() != 32 && (long)gn * ((a.t + 63) / 64) >= sm_count());
  const int gm = big ? (a.t + 63) / 64 : (a.t + 31) / 32;
  // Residual GEMMs with too few tiles to fill the GPU (e.g. down: 9 column tiles at 32 tokens)
  // split K over blocks and add their partial sums atomically into the residual.
  int splits = 1;
  const int target = 4 * sm_count();  // ~4 blocks per SM to hide the per-step latency
  if (E == GemmEpilogue::Accumulate && !a.norm_w && gn * gm < target)
    splits = std::min(ksteps, (target + gn * gm - 1) / (gn * gm));
  const int kchunk = ((ksteps + splits - 1) / splits) * kBK;
  splits = (a.k + kchunk - 1) / kchunk;
  const dim3 grid(gn, gm, splits);
  if (big && occ2()) {
    launch_pdl(gemm_tc_kernel<B, E, 64, 2>, grid, dim3(kThreads), s, a, o, kchunk);
  } else if (big) {
    launch_pdl(gemm_tc_kernel<B, E, 64, 1>, grid, dim3(kThreads), s, a, o, kchunk);
  } else {
    launch_pdl(gemm_tc_kernel<B, E, 32, 1>, grid, dim3(kThreads), s, a, o, kchunk);
  }
  CUDA_CHECK_LAUNCH();
}

template void launch_gemm_tc<BlockQ4_0, GemmEpilogue::Store>(const GemmArgs&, const GemmOut&,
                                                             cudaStream_t);
template void launch_gemm_tc<BlockQ4_0, GemmEpilogue::Accumulate>(const GemmArgs&, const GemmOut&,
                                                                  cudaStream_t);
template void launch_gemm_tc<BlockQ4_0, GemmEpilogue::SiluPair>(const GemmArgs&, const GemmOut&,
                                                                cudaStream_t);
template void launch_gemm_tc<BlockQ4_0, GemmEpilogue::QkvRope>(const GemmArgs&, const GemmOut&,
                                                               cudaStream_t);
template void launch_gemm_tc<BlockQ8_0, GemmEpilogue::Store>(const GemmArgs&, const GemmOut&,
                                                             cudaStream_t);

}  // namespace smolrt::cuda::detail
