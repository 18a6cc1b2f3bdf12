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
constexpr int kXPad = 20;      // floats per 16-column chunk of x in shared memory (16 + 4)
constexpr int kSms = 132;      // Hopper H100/H200 SXM

// Blocks per SM the register budget allows (launch bounds below): all resident at once.
constexpr int min_blocks(int u) {
  return u <= 5 ? 3 : 2;
}

// x (RMS-normalized when norm_w is set) into shared memory, chunk k of 16 columns at k*kXPad
// floats: the float4 reads of 8 lanes with consecutive k then hit distinct banks. NT threads
// (NT*4 >= cols); ends with a block barrier.
template <int NT>
__device__ __forceinline__ void stage_head_x(float* xs, const HeadArgs& a) {
  constexpr int K = kHeadMaxCols / 4 / NT;  // float4 per thread at most
  __shared__ float rs[NT / 32];
  const int cols = a.w.cols, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n4 = cols / 4;
  const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
  const float4* x4 = reinterpret_cast<const float4*>(a.x);
  const float4* w4 = reinterpret_cast<const float4*>(a.norm_w);
  float4 v[K], nw[K];
#pragma unroll
  for (int i = 0; i < K; ++i) {
    const int c4 = threadIdx.x + i * NT;
    v[i] = c4 < n4 ? x4[c4] : z;
    nw[i] = a.norm_w != nullptr && c4 < n4 ? w4[c4] : z;
  }
  if (a.norm_w != nullptr) {
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < K; ++i) {
      ss += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
    }
    ss = warp_sum(ss);
    if (lane == 0) rs[warp] = ss;
    __syncthreads();
    float tot = 0.f;
#pragma unroll
    for (int k = 0; k < NT / 32; ++k) tot += rs[k];
    const float sc = rsqrtf(tot / (float)cols + a.eps);
#pragma unroll
    for (int i = 0; i < K; ++i) {
      v[i].x = v[i].x * sc * nw[i].x;
      v[i].y = v[i].y * sc * nw[i].y;
      v[i].z = v[i].z * sc * nw[i].z;
      v[i].w = v[i].w * sc * nw[i].w;
    }
  }
#pragma unroll
  for (int i = 0; i < K; ++i) {
    const int c4 = threadIdx.x + i * NT;
    if (c4 < n4) *reinterpret_cast<float4*>(xs + (c4 >> 2) * kXPad + (c4 & 3) * 4) = v[i];
  }
  __syncthreads();
}

// Dot of one 16-byte Q8_0 quant vector (16 int8) with its 16 staged x values (no I2F).
__device__ __forceinline__ float q8_vec_dot(uint4 w, const float* xk) {
  const uint32_t ww[4] = {w.x ^ 0x80808080u, w.y ^ 0x80808080u, w.z ^ 0x80808080u,
                          w.w ^ 0x80808080u};
  const float4* x4 = reinterpret_cast<const float4*>(xk);
  float t = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float4 xv = x4[i];
    t += (byte_plus_2p23(ww[i], 0) - kQ8Bias) * xv.x + (byte_plus_2p23(ww[i], 1) - kQ8Bias) * xv.y +
         (byte_plus_2p23(ww[i], 2) - kQ8Bias) * xv.z + (byte_plus_2p23(ww[i], 3) - kQ8Bias) * xv.w;
  }
  return t;
}

// Row sums of one group from the warp's per-vector partials (myred[u], u < kHeadRows*urow):
// lane (rr, qq) takes every 8th partial of row rr, then a fixed xor tree (deterministic); the
// row's lane qq == 0 writes it and keeps the argmax candidate.
__device__ __forceinline__ void head_rows_out(const HeadArgs& a, const float* myred, int urow,
                                              int g, float& best_v, int& best_i) {
  const int lane = threadIdx.x & 31, rr = lane >> 3, qq = lane & 7;
  float s = 0.f;
  for (int k = qq; k < urow; k += 8) s += myred[rr * urow + k];
  s += __shfl_xor_sync(0xffffffffu, s, 1);
  s += __shfl_xor_sync(0xffffffffu, s, 2);
  s += __shfl_xor_sync(0xffffffffu, s, 4);
  const int row = g * kHeadRows + rr;
  if (qq == 0 && row < a.w.rows) {
    a.out[row] = s;
    if (!isnan(s) && amax_beats(s, row, best_v, best_i)) best_v = s, best_i = row;
  }
}

// Fused argmax stage 1 (one partial per block) and, with fin, stage 2 by the last block.
template <int NT>
__device__ __forceinline__ void head_argmax_epilogue(const HeadArgs& a, float best_v, int best_i) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best_v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (amax_beats(ov, oi, best_v, best_i)) best_v = ov, best_i = oi;
  }
  __shared__ float sv[NT / 32];
  __shared__ int si[NT / 32];
  if (lane == 0) {
    sv[warp] = best_v;
    si[warp] = best_i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int k = 1; k < NT / 32; ++k) {
      if (amax_beats(sv[k], si[k], best_v, best_i)) best_v = sv[k], best_i = si[k];
    }
    a.part_v[blockIdx.x] = best_v;
    a.part_i[blockIdx.x] = best_i;
  }
  if (a.fin.count != nullptr) argmax_last_block<NT>(a.fin, a.part_v, a.part_i, sv, si);
}

// U = 16-byte quant vectors per lane per group (U*32 >= kHeadRows*cols/16). Two groups' worth of
// registers: the next group loads while this one is reduced.
template <int U>
__global__ void __launch_bounds__(kHT, min_blocks(U)) head_q8_kernel(const HeadArgs a) {
  pdl_entry(a.early);
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
#pragma unroll
    for (int j = 0; j < U; ++j) {
      const int u = lane + 32 * j;
      const size_t gi = base + u;
      if (u < ug && gi < total) {
        w[j] = __ldg(q + gi);
        d[j] = half_bits_to_float(__ldg(a.w.d + gi / 2));
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
  pdl_enter(a.early);

  extern __shared__ float4 head_smem[];
  float* xs = reinterpret_cast<float*>(head_smem);  // [urow * kXPad]
  float* red = xs + (size_t)urow * kXPad;           // [kHW][ug] per-vector partial dots
  stage_head_x<kHT>(xs, a);
  float* myred = red + (size_t)warp * ug;
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
      if (u < ug) myred[u] = d0[j] * q8_vec_dot(w0[j], xs + (u % urow) * kXPad);
    }
    __syncwarp();
    head_rows_out(a, myred, urow, g, best_v, best_i);
    __syncwarp();  // myred is rewritten by the next group
    if (more) {
#pragma unroll
      for (int j = 0; j < U; ++j) {
        w0[j] = w1[j];
        d0[j] = d1[j];
      }
    }
  }
  if (a.part_v != nullptr) head_argmax_epilogue<kHT>(a, best_v, best_i);
}

// cp.async variant (cols a multiple of 64, at most kAsyncMaxCols): each warp streams its groups
// through a ring of kStages shared-memory buffers (quants + scales) with cp.async, so several
// groups per warp are in flight with no register cost and a warp waits for DRAM about once
// instead of once per group. 4 warps per block keep the ring under the 48 KB default limit.
constexpr int kAT = 128;
constexpr int kAW = kAT / 32;
constexpr int kStages = 3;
constexpr int kAsyncMaxCols = 640;
constexpr int kAsyncU = 5;  // quant vectors per lane per group: 32*5 >= kHeadRows*640/16

__global__ void __launch_bounds__(kAT) head_q8_async_kernel(const HeadArgs a) {
  pdl_entry(a.early);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int cols = a.w.cols, rows = a.w.rows;
  const int urow = cols / 16;
  const int ug = kHeadRows * urow;  // quant vectors per group
  const int sg = ug / 16;           // 16-byte scale chunks per group (ug/2 halves = ug bytes)
  const size_t total = (size_t)rows * urow;
  const int n_groups = (rows + kHeadRows - 1) / kHeadRows;
  const int stride = gridDim.x * kAW;
  const uint4* q = static_cast<const uint4*>(a.w.q);
  const char* dbytes = reinterpret_cast<const char*>(a.w.d);
  const size_t dtotal = total;  // bytes of scales: total/2 halves

  extern __shared__ float4 head_smem[];
  float* xs = reinterpret_cast<float*>(head_smem);                  // [urow * kXPad]
  float* red = xs + (size_t)urow * kXPad;                           // [kAW][ug]
  uint4* wring = reinterpret_cast<uint4*>(red + (size_t)kAW * ug);  // [kAW][kStages][ug]
  uint4* sring = wring + (size_t)kAW * kStages * ug;                // [kAW][kStages][sg]
  uint4* mw = wring + (size_t)warp * kStages * ug;
  uint4* ms = sring + (size_t)warp * kStages * sg;

  // Group g into ring slot st (zero-filled past the matrix end); one commit group per call.
  auto issue = [&](int g, int st) {
    if (g < n_groups) {
      const size_t base = (size_t)g * ug;
#pragma unroll
      for (int j = 0; j < kAsyncU; ++j) {
        const int u = lane + 32 * j;
        if (u < ug) {
          const bool in = base + u < total;
          cp_async16(mw + (size_t)st * ug + u, in ? q + base + u : q, in ? 16 : 0);
        }
      }
      if (lane < sg) {
        const size_t off = base + (size_t)lane * 16;  // byte offset of this scale chunk
        const int n = off >= dtotal ? 0 : (dtotal - off >= 16 ? 16 : (int)(dtotal - off));
        cp_async16(ms + (size_t)st * sg + lane, n > 0 ? dbytes + off : dbytes, n);
      }
    }
    cp_async_commit();
  };

  int g = blockIdx.x * kAW + warp;
#pragma unroll
  for (int st = 0; st < kStages; ++st) issue(g + st * stride, st);  // weights: before the wait
  pdl_enter(a.early);
  stage_head_x<kAT>(xs, a);

  float* myred = red + (size_t)warp * ug;
  float best_v = 0.f;
  int best_i = INT_MAX;
  for (int it = 0; g < n_groups; g += stride, ++it) {
    const int st = it % kStages;
    cp_async_wait<kStages - 1>();  // this lane's copies of the oldest group have landed
    __syncwarp();                  // ... and every lane's
    const uint4* wv = mw + (size_t)st * ug;
    const uint16_t* dv = reinterpret_cast<const uint16_t*>(ms + (size_t)st * sg);
#pragma unroll
    for (int j = 0; j < kAsyncU; ++j) {
      const int u = lane + 32 * j;
      if (u < ug) {
        myred[u] = half_bits_to_float(dv[u / 2]) * q8_vec_dot(wv[u], xs + (u % urow) * kXPad);
      }
    }
    __syncwarp();
    head_rows_out(a, myred, urow, g, best_v, best_i);
    __syncwarp();                     // slot st and myred are free again
    issue(g + kStages * stride, st);  // refill the slot kStages groups ahead
  }
  cp_async_wait<0>();  // nothing in flight at exit
  if (a.part_v != nullptr) head_argmax_epilogue<kAT>(a, best_v, best_i);
}

bool use_async(const DevMat& w) {
  return head_async_enabled() && w.cols % 64 == 0 && w.cols <= kAsyncMaxCols;
}

size_t async_smem(int cols) {
  const size_t urow = cols / 16, ug = kHeadRows * urow;
  return sizeof(float) * (urow * kXPad + kAW * ug) + sizeof(uint4) * kAW * kStages * (ug + ug / 16);
}

int u_for(int cols) {
  return cols <= 640 ? 5 : 8;
}

}  // namespace

bool& wide_head_enabled() {
  static bool on = true;
  return on;
}

bool& head_async_enabled() {
  static bool on = true;
  return on;
}

void head_gemv_init() {
  static const bool done = [] {  // 5 blocks of ~35-40 KB per SM need the max carveout
    CUDA_CHECK(cudaFuncSetAttribute(head_q8_async_kernel,
                                    cudaFuncAttributePreferredSharedMemoryCarveout, 100));
    return true;
  }();
  (void)done;
}

bool head_kernel_takes(const DevMat& w) {
  return wide_head_enabled() && w.type == GgmlType::Q8_0 && w.cols % 32 == 0 &&
         w.cols <= kHeadMaxCols && w.rows >= kHeadMinRows && w.d != nullptr;
}

int head_grid(const DevMat& w, int max_blocks) {
  // All blocks resident at once: registers bound the register variant; the async one has 4
  // warps and ~35-40 KB of shared memory per block (5 per SM).
  const bool async = use_async(w);
  const int per_sm = async ? 5 : min_blocks(u_for(w.cols));
  const int wpb = async ? kAW : kHW;
  const int resident = kSms * per_sm;
  const int cap = max_blocks > 0 && max_blocks < resident ? max_blocks : resident;
  const int groups = (w.rows + kHeadRows - 1) / kHeadRows;
  const int blocks = (groups + wpb - 1) / wpb;
  return blocks < cap ? blocks : cap;
}

int head_gemv(const HeadArgs& a0, int max_blocks, cudaStream_t s) {
  HeadArgs a = a0;
  a.early = pdl_early_flag();
  const int grid = head_grid(a.w, max_blocks);
  const int urow = a.w.cols / 16;
  if (use_async(a.w)) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(s, &cs));
    if (cs == cudaStreamCaptureStatusNone) head_gemv_init();  // (the backend calls it earlier)
    launch_kernel(head_q8_async_kernel, dim3(grid), dim3(kAT), async_smem(a.w.cols), s, a);
    return grid;
  }
  const size_t smem = sizeof(float) * ((size_t)urow * kXPad + (size_t)kHW * kHeadRows * urow);
  if (u_for(a.w.cols) == 5) {
    launch_kernel(head_q8_kernel<5>, dim3(grid), dim3(kHT), smem, s, a);
  } else {
    launch_kernel(head_q8_kernel<8>, dim3(grid), dim3(kHT), smem, s, a);
  }
  return grid;
}

}  // namespace smolrt::cuda
