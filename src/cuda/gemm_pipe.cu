// Tensor-core multi-token GEMM with a cp.async pipeline: the default TensorCore path when the
// weight rows are 4-byte aligned (Q4_0/Q8_0 rows of k a multiple of 64; gemm_tc.cu otherwise).
//
// Why: the register-lookahead kernel (gemm_tc.cu) stalled ~57% of its cycles on global-load
// scoreboards (ncu, H200, T=512) at 1 block/SM (181 registers), and ran each 128-wide K step as a
// serialized ~1.8 us round trip. Here raw tiles (fp32 activations, raw GGUF weight blocks) are
// copied global->shared with cp.async, kStages-1 steps ahead of the math, costing no registers;
// a convert pass per step turns them into fp16 tiles (RMSNorm weight applied, row sums of squares
// accumulated), then WMMA m16n16k16 with fp32 accumulation. 32 tokens x 64 rows per 256-thread
// block, ~110 KB dynamic shared memory: 2 blocks (16 warps) per SM.
#include <mma.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda_check.h"
#include "cuda/gemm_common.cuh"
#include "cuda/launch.cuh"

namespace smolrt::cuda::detail {
namespace {

using namespace nvcuda;

constexpr int kBM = 32, kBN = 64, kBK = 128, kThreads = 256, kStages = 4;
constexpr int kLDS = kBK + 8;  // fp16 row pitch (+16 B: rows skew across banks, 32 B aligned)
constexpr int kLDC = kBN + 4;  // fp32 pitch of the staged output tile

__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, int src_bytes) {
  const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes)
               : "memory");
}

// Shared-memory layout (bytes), all offsets 16-byte aligned.
template <class B>
struct PipeLayout {
  static constexpr int kW32 = 4 * (int)sizeof(B) / 4;              // u32 words of one row-step
  static constexpr int kRawA = kBM * kBK * 4;                      // fp32 activation tile
  static constexpr int kRawW = ((kBN * kW32 * 4) + 15) / 16 * 16;  // raw weight blocks
  static constexpr int kStage = kRawA + kRawW;
  static constexpr int kHalfA = kBM * kLDS * 2;
  static constexpr int kHalfB = kBN * kLDS * 2;
  static constexpr int kTiles = kStages * kStage;  // then A fp16, B fp16 (C aliases them)
  static constexpr int kRs = kTiles + kHalfA + kHalfB;
  static constexpr int kNorm = kRs + kBM * 4;  // then k floats of the RMSNorm weight
  static_assert(kBM * kLDC * 4 <= kHalfA + kHalfB, "output tile must fit the fp16 tiles");
  static_assert(4 * (int)sizeof(B) % 4 == 0, "a row-step must be whole words");
  static int bytes(int k, bool norm) { return kNorm + (norm ? k * 4 : 0); }
};

template <class B, GemmEpilogue E>
__global__ void __launch_bounds__(kThreads, 2) gemm_pipe_kernel(GemmArgs a, GemmOut o, int kchunk) {
  using L = PipeLayout<B>;
  constexpr int XV = kBM * kBK / 4 / kThreads;  // float4 activation chunks per thread per step
  extern __shared__ __align__(128) unsigned char smem[];
  __half* Ah = reinterpret_cast<__half*>(smem + L::kTiles);
  __half* Bh = reinterpret_cast<__half*>(smem + L::kTiles + L::kHalfA);
  float* rs = reinterpret_cast<float*>(smem + L::kRs);
  float* nws = reinterpret_cast<float*>(smem + L::kNorm);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int t0 = blockIdx.y * kBM, n0 = blockIdx.x * kBN;
  const size_t rb = (size_t)(a.k / 32) * sizeof(B);  // bytes per weight row
  const int kbeg = blockIdx.z * kchunk, kend = min(a.k, kbeg + kchunk);
  const int nsteps = (kend - kbeg + kBK - 1) / kBK;
  const bool norm = a.norm_w != nullptr;
  const char* wbytes = static_cast<const char*>(a.w);

  pdl_wait();  // x (and the residual y) come from the previous kernel
  pdl_trigger();

  auto issue = [&](int step) {
    unsigned char* st = smem + (step % kStages) * L::kStage;
    float* ra = reinterpret_cast<float*>(st);
    uint32_t* rw = reinterpret_cast<uint32_t*>(st + L::kRawA);
    const int kb = kbeg + step * kBK;
#pragma unroll
    for (int j = 0; j < XV; ++j) {
      const int i = tid + kThreads * j, r = i / (kBK / 4), c = (i % (kBK / 4)) * 4;
      const int tok = t0 + r, kk = kb + c;
      const bool ok = tok < a.t && kk < a.k;
      cp_async16(ra + r * kBK + c, ok ? a.x + (size_t)tok * a.ldx + kk : a.x, ok ? 16 : 0);
    }
    const size_t boff = (size_t)(kb / 32) * sizeof(B);  // byte offset of this step in a row
    for (int i = tid; i < kBN * L::kW32; i += kThreads) {
      const int row = i / L::kW32, w = i % L::kW32;
      const size_t off = boff + 4 * (size_t)w;
      const bool ok = n0 + row < a.n && off < rb;  // past the row end: zeros (d = 0)
      cp_async4(rw + i, ok ? wbytes + (size_t)(n0 + row) * rb + off : wbytes, ok ? 4 : 0);
    }
  };
  if (norm)  // the whole RMSNorm weight once per block (k floats)
    for (int i = tid; i < a.k; i += kThreads) nws[i] = __ldg(a.norm_w + i);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nsteps) issue(s);
    cp_async_commit();  // empty groups keep the wait_group count uniform
  }

  float ss[XV];  // RMSNorm: this thread's partial sums of squares, rows (tid + 256 j) / 32
#pragma unroll
  for (int j = 0; j < XV; ++j) ss[j] = 0.f;
  const int wm = warp >> 2, wn = warp & 3;  // 2 warps along tokens (16 each) x 4 along rows
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 0.f);
  const int wrow = tid >> 2, wblk = tid & 3;  // convert: weight row of the tile, block in the step

  for (int step = 0; step < nsteps; ++step) {
    cp_async_wait<kStages - 2>();  // this step's group has landed (this thread's copies)
    __syncthreads();               // ... and everyone's; the fp16 tiles are free again
    {
      const unsigned char* st = smem + (step % kStages) * L::kStage;
      const float* ra = reinterpret_cast<const float*>(st);
      const int kb = kbeg + step * kBK;
#pragma unroll
      for (int j = 0; j < XV; ++j) {
        const int i = tid + kThreads * j, r = i / (kBK / 4), c = (i % (kBK / 4)) * 4;
        float4 v = *reinterpret_cast<const float4*>(ra + r * kBK + c);
        if (norm) {
          ss[j] += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
          const int kk = kb + c;
          if (kk < a.k) {
            const float4 w = *reinterpret_cast<const float4*>(nws + kk);
            v.x *= w.x, v.y *= w.y, v.z *= w.z, v.w *= w.w;
          }
        }
        __half2 h[2] = {__floats2half2_rn(v.x, v.y), __floats2half2_rn(v.z, v.w)};
        *reinterpret_cast<uint2*>(&Ah[r * kLDS + c]) = *reinterpret_cast<const uint2*>(h);
      }
      const uint16_t* rw = reinterpret_cast<const uint16_t*>(st + L::kRawA) + wrow * (2 * L::kW32) +
                           wblk * (sizeof(B) / 2);
      __half2 w[16];
      WBlock<B>::dequant32(rw, w);
      uint4* dst = reinterpret_cast<uint4*>(&Bh[wrow * kLDS + wblk * 32]);
      const uint4* src = reinterpret_cast<const uint4*>(w);
#pragma unroll
      for (int v = 0; v < 4; ++v) dst[v] = src[v];
    }
    __syncthreads();  // fp16 tiles complete; this step's raw stage is free
    if (step + kStages - 1 < nsteps) issue(step + kStages - 1);
    cp_async_commit();
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
      wmma::load_matrix_sync(fb, &Bh[(wn * 16) * kLDS + kk], kLDS);
      wmma::load_matrix_sync(fa, &Ah[(wm * 16) * kLDS + kk], kLDS);
      wmma::mma_sync(acc, fa, fb, acc);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is past its last MMA: C may overwrite the fp16 tiles
  if (norm) {       // row (tid + 256 j) / 32 = warp + 8 j: reduce over the warp's 32 lanes
#pragma unroll
    for (int j = 0; j < XV; ++j) {
      float v = ss[j];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0) rs[warp + 8 * j] = rsqrtf(v / (float)a.k + a.eps);
    }
  }
  float* Cs = reinterpret_cast<float*>(smem + L::kTiles);
  wmma::store_matrix_sync(&Cs[(wm * 16) * kLDC + wn * 16], acc, kLDC, wmma::mem_row_major);
  __syncthreads();

  store_tile<E, kBM, kBN, kLDC, kThreads>(a, o, Cs, rs, norm, t0, n0, tid);
}

}  // namespace

template <class B, GemmEpilogue E>
bool launch_gemm_pipe(const GemmArgs& a, const GemmOut& o, int sms, cudaStream_t s) {
  using L = PipeLayout<B>;
  const size_t rb = (size_t)(a.k / 32) * sizeof(B);
  // cp.async of 4-byte words: the weight base and every row start must be word aligned.
  if ((reinterpret_cast<uintptr_t>(a.w) & 3u) || (rb & 3u)) return false;
  const int bytes = L::bytes(a.k, a.norm_w != nullptr);
  if (bytes > 227 * 1024) return false;
  static int configured = 0;  // per instantiation: raise the dynamic shared-memory limit once
  if (configured < bytes) {
    CUDA_CHECK(cudaFuncSetAttribute(gemm_pipe_kernel<B, E>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
    configured = 227 * 1024;
  }
  const int gn = (a.n + kBN - 1) / kBN, gm = (a.t + kBM - 1) / kBM;
  const int ksteps = (a.k + kBK - 1) / kBK;
  int splits = 1;  // residual GEMMs with too few tiles: split K, add partial sums atomically
  const int target = 4 * sms;
  if (E == GemmEpilogue::Accumulate && !a.norm_w && gn * gm < target)
    splits = std::min(ksteps, (target + gn * gm - 1) / (gn * gm));
  const int kchunk = ((ksteps + splits - 1) / splits) * kBK;
  splits = (a.k + kchunk - 1) / kchunk;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(gn, gm, splits);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = bytes;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = s ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, gemm_pipe_kernel<B, E>, a, o, kchunk));
  return true;
}

template bool launch_gemm_pipe<BlockQ4_0, GemmEpilogue::Store>(const GemmArgs&, const GemmOut&, int,
                                                               cudaStream_t);
template bool launch_gemm_pipe<BlockQ4_0, GemmEpilogue::Accumulate>(const GemmArgs&, const GemmOut&,
                                                                    int, cudaStream_t);
template bool launch_gemm_pipe<BlockQ4_0, GemmEpilogue::SiluPair>(const GemmArgs&, const GemmOut&,
                                                                  int, cudaStream_t);
template bool launch_gemm_pipe<BlockQ4_0, GemmEpilogue::QkvRope>(const GemmArgs&, const GemmOut&,
                                                                 int, cudaStream_t);
template bool launch_gemm_pipe<BlockQ8_0, GemmEpilogue::Store>(const GemmArgs&, const GemmOut&, int,
                                                               cudaStream_t);

}  // namespace smolrt::cuda::detail
