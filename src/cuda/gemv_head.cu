// Wide lm_head matvec (see gemv_head.h).
#include "cuda/gemv_head.h"

#include <climits>

#include "core/error.h"
#include "cuda/argmax_block.cuh"
#include "cuda/device_common.cuh"
#include "cuda/launch.h"

namespace smolrt::cuda {
namespace {

constexpr int kHT = 256;       // threads per block
constexpr int kHW = kHT / 32;  // warps per block
constexpr int kHeadRows = 4;   // rows per warp group: kHeadRows*cols/16 quant vectors
constexpr int kSms = 132;      // Hopper H100/H200 SXM

// Blocks per SM the register budget allows (launch bounds below): all resident at once.
constexpr int min_blocks(int u) {
  return u <= 5 ? 3 : 2;
}

// Shared memory ahead of the per-vector partial dots: x quantized to two int8 levels
// (qformat.h quantize_x4: each element within max|x| / 64516 of its 32-column block; the CPU twin
// in the kernel test bounds the logits with exactly that) as [hi bytes: cols][lo bytes: cols]
// [block scales: cols / 32 floats], a multiple of 4 bytes.
__host__ __device__ constexpr size_t head_x_bytes(int cols) {
  return 2 * (size_t)cols + sizeof(float) * (cols / 32);
}

// U = 16-byte quant vectors per lane per group (U*32 >= kHeadRows*cols/16). Two groups' worth of
// registers: the next group loads while this one is reduced.
// The dot products run on DP4A against the two-level int8 x (4 MACs per instruction, no
// dequantization: several times fewer instructions than an fp32 path, which is issue-bound here).
template <int U>
__global__ void __launch_bounds__(kHT, min_blocks(U)) head_q8_kernel(const HeadArgs a) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int cols = a.w.cols, rows = a.w.rows;
  const int urow = cols / 16;  // quant vectors per row
  const int ug = kHeadRows * urow;
  const size_t total = (size_t)rows * urow;
  const int n_groups = (rows + kHeadRows - 1) / kHeadRows;
  const int stride = gridDim.x * kHW;
  const uint4* q = static_cast<const uint4*>(a.w.q);

  // Vector gi holds columns 16*(gi % urow) .. +16 of row gi / urow; its scale is d[gi / 2]
  // (two vectors per 32-column block). Past the end: zeros, which contribute exactly 0.
  auto load = [&](int g, uint4(&w)[U], float(&d)[U]) {
    const size_t base = (size_t)g * ug;
    const bool whole = base + ug <= total;  // every group but a short last one (warp-uniform)
#pragma unroll
    for (int j = 0; j < U; ++j) {
      const int u = lane + 32 * j;
      const size_t gi = base + u;
      if (u < ug && (whole || gi < total)) {
        w[j] = __ldg(q + gi);
        d[j] = h2f(__ldg(a.w.d + gi / 2));
      } else {
        w[j] = make_uint4(0u, 0u, 0u, 0u);
        d[j] = 0.f;
      }
    }
  };

  int g = blockIdx.x * kHW + warp;
  uint4 w0[U];
  float d0[U];
  if (g < n_groups) load(g, w0, d0);  // weights never depend on the previous kernel
  pdl_wait();
  pdl_trigger();

  // x (RMS-normalized when norm_w is set) into shared memory (head_x_bytes), then the partials.
  extern __shared__ float4 head_smem[];
  float* red = reinterpret_cast<float*>(reinterpret_cast<char*>(head_smem) +
                                        head_x_bytes(cols));  // [kHW][ug] partial dots
  uint32_t* xhi = reinterpret_cast<uint32_t*>(head_smem);
  uint32_t* xlo = xhi + cols / 4;
  float* xsc = reinterpret_cast<float*>(xlo + cols / 4);
  __shared__ float rs[kHW];
  {
    const int n4 = cols / 4;  // <= kHT
    const int c4 = threadIdx.x;
    const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
    float4 v = c4 < n4 ? reinterpret_cast<const float4*>(a.x)[c4] : z;
    if (a.norm_w != nullptr) {
      const float4 nw = c4 < n4 ? reinterpret_cast<const float4*>(a.norm_w)[c4] : z;
      float ss = warp_sum(sum_sq(v));
      if (lane == 0) rs[warp] = ss;
      __syncthreads();
      float tot = 0.f;
#pragma unroll
      for (int k = 0; k < kHW; ++k) tot += rs[k];
      const float sc = rsqrtf(tot / (float)cols + a.eps);
      v.x = v.x * sc * nw.x;
      v.y = v.y * sc * nw.y;
      v.z = v.z * sc * nw.z;
      v.w = v.w * sc * nw.w;
    }
    {
      // The 8 threads of a 32-column block (consecutive c4, one warp) quantize it together.
      uint32_t hi, lo;
      float sc, unused = 0.f;
      quantize_x4<false>(v, hi, lo, sc, unused);
      if (c4 < n4) {
        xhi[c4] = hi;
        xlo[c4] = lo;
        if ((c4 & 7) == 0) xsc[c4 >> 3] = sc;
      }
    }
  }
  __syncthreads();

  float* myred = red + (size_t)warp * ug;
  const int rr = lane >> 3, qq = lane & 7;  // reduction role: row rr of the group, lane qq of 8
  // Per lane and slot j, the same in every group: the 16-column chunk of vector u = lane + 32j
  // and (I8) its x block scale, held in registers where they fit (U = 8 would spill), so the
  // loop does no integer division and no scale load.
  constexpr bool kRegs = U <= 5;
  int cj[kRegs ? U : 1];
  float sj[kRegs ? U : 1];
  if constexpr (kRegs) {
#pragma unroll
    for (int j = 0; j < U; ++j) {
      const int u = lane + 32 * j;
      cj[j] = u < ug ? u % urow : 0;
      sj[j] = xsc[cj[j] >> 1];
    }
  }
  auto chunk_of = [&](int j, int u) {  // 16-column chunk c: x words 4c..4c+3, x block c / 2
    if constexpr (kRegs) {
      return cj[j];
    } else {
      return u % urow;
    }
  };
  auto scale_of = [&](int j, int c) {  // the x block scale of chunk c
    if constexpr (kRegs) {
      return sj[j];
    } else {
      return xsc[c >> 1];
    }
  };
  float best_v = 0.f;
  int best_i = INT_MAX;
  for (; g < n_groups; g += stride) {
    const bool more = g + stride < n_groups;
    uint4 w1[U];
    float d1[U];
    if (more) load(g + stride, w1, d1);
#pragma unroll
    for (int j = 0; j < U; ++j) {
      const int u = lane + 32 * j;
      if (u < ug) {
        const int c = chunk_of(j, u);
        const uint4 h = reinterpret_cast<const uint4*>(xhi)[c];
        const uint4 l = reinterpret_cast<const uint4*>(xlo)[c];
        int ih = 0, il = 0;
        idot16(w0[j], h, l, ih, il);
        myred[u] = d0[j] * scale_of(j, c) * two_level(ih, il);
      }
    }
    __syncwarp();
    // Row rr's urow partials: 8 lanes take every 8th, then a fixed xor tree (deterministic).
    // All loads first (fixed trip count), then the sum in the same k order.
    constexpr int kRed = (U * 32 / kHeadRows + 7) / 8;  // urow <= U * 32 / kHeadRows
    float pr[kRed];
#pragma unroll
    for (int i = 0; i < kRed; ++i) {
      const int k = qq + 8 * i;
      pr[i] = k < urow ? myred[rr * urow + k] : 0.f;
    }
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < kRed; ++i)
      if (qq + 8 * i < urow) s += pr[i];
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    s += __shfl_xor_sync(0xffffffffu, s, 4);
    const int row = g * kHeadRows + rr;
    if (qq == 0 && row < rows) {
      a.out[row] = s;
      if (!isnan(s) && amax_beats(s, row, best_v, best_i)) best_v = s, best_i = row;
    }
    __syncwarp();  // myred is rewritten by the next group
    if (more) {
#pragma unroll
      for (int j = 0; j < U; ++j) {
        w0[j] = w1[j];
        d0[j] = d1[j];
      }
    }
  }

  if (a.part_v == nullptr) return;
  // Fused argmax stage 1: one partial per block.
  __shared__ float sv[kHW];
  __shared__ int si[kHW];
  block_argmax<kHT>(best_v, best_i, sv, si);
  if (threadIdx.x == 0) {
    a.part_v[blockIdx.x] = best_v;
    a.part_i[blockIdx.x] = best_i;
  }
}

int u_for(int cols) {
  return cols <= 640 ? 5 : 8;
}

}  // namespace

bool head_kernel_takes(const DevMat& w) {
  return w.type == GgmlType::Q8_0 && w.cols % 32 == 0 && w.cols <= kHeadMaxCols &&
         w.rows >= kHeadMinRows && w.d != nullptr;
}

int head_grid(const DevMat& w, int max_blocks) {
  const int resident = kSms * min_blocks(u_for(w.cols));
  const int cap = max_blocks > 0 && max_blocks < resident ? max_blocks : resident;
  const int groups = (w.rows + kHeadRows - 1) / kHeadRows;
  const int blocks = (groups + kHW - 1) / kHW;
  return blocks < cap ? blocks : cap;
}

int head_gemv(const HeadArgs& a, int max_blocks, const Launch& s) {
  const int grid = head_grid(a.w, max_blocks);
  const int cols = a.w.cols;
  const size_t smem = head_x_bytes(cols) + sizeof(float) * kHW * kHeadRows * (cols / 16);
  if (u_for(cols) == 5) {
    launch_kernel(head_q8_kernel<5>, dim3(grid), dim3(kHT), smem, s, a);
  } else {
    launch_kernel(head_q8_kernel<8>, dim3(grid), dim3(kHT), smem, s, a);
  }
  return grid;
}

}  // namespace smolrt::cuda
