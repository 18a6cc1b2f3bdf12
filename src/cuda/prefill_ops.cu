// argmax_rows (see prefill_ops.h).
#include "cuda/prefill_ops.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include <cooperative_groups.h>

#include "core/cuda_check.h"
#include "core/error.h"
#include "cuda/argmax_block.cuh"
#include "cuda/device_common.cuh"
#include "cuda/launch.cuh"

namespace smolrt::cuda {
namespace {

namespace cg = cooperative_groups;

// argmax_rows: a cluster of kRowSplit blocks per row (a block per row leaves most SMs idle when a
// step has tens of rows, and one block cannot keep enough loads in flight for a wide row). Each
// block scans one slice of the row, 16-byte loads where the rows allow them, and block 0 of the
// cluster combines the blocks' winners through distributed shared memory: one launch, no scratch.
constexpr int kRowSplit = 8, kRowThreads = 256;

__global__ void __cluster_dims__(kRowSplit, 1, 1) __launch_bounds__(kRowThreads)
    argmax_rows_kernel(const float* logits, int ld, int n, int* out, bool vec) {
  cg::cluster_group cl = cg::this_cluster();
  const int part = (int)cl.block_rank(), row = blockIdx.y, tid = threadIdx.x;
  // Slices of a multiple of 4 columns, so the 16-byte loads stay within one.
  const int chunk = ((n + kRowSplit - 1) / kRowSplit + 3) / 4 * 4;
  const int c0 = min(n, part * chunk), c1 = min(n, c0 + chunk);
  const float* r = logits + (size_t)row * ld;
  float bv = 0.f;
  int bi = INT_MAX;
  detail::pdl_wait();  // logits come from the lm_head GEMM
  detail::pdl_trigger();
  int scalar_from = c0;
  if (vec) {
    const int q1 = c1 / 4;  // whole float4s of the slice: [c0 / 4, q1)
    const float4* r4 = reinterpret_cast<const float4*>(r);
#pragma unroll 4
    for (int q = c0 / 4 + tid; q < q1; q += kRowThreads) {
      const float4 u = r4[q];
      const float e[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (!isnan(e[j]) && amax_beats(e[j], 4 * q + j, bv, bi)) bv = e[j], bi = 4 * q + j;
    }
    scalar_from = max(c0, 4 * q1);
  }
  amax_scan(r, scalar_from + tid, c1, kRowThreads, bv, bi);
  __shared__ float sv[kRowThreads / 32];
  __shared__ int si[kRowThreads / 32];
  __shared__ float cv;
  __shared__ int ci;
  block_argmax<kRowThreads>(bv, bi, sv, si);
  if (tid == 0) cv = bv, ci = bi;
  cl.sync();
  if (part == 0 && tid == 0) {
    for (int b = 1; b < kRowSplit; ++b) {
      const float v = *cl.map_shared_rank(&cv, b);
      const int i = *cl.map_shared_rank(&ci, b);
      if (amax_beats(v, i, bv, bi)) bv = v, bi = i;
    }
    out[row] = bi == INT_MAX ? 0 : bi;  // all NaN: 0
  }
  cl.sync();  // the blocks' shared memory lives until block 0 has read it
}

__global__ void gather_rows_kernel(const float* x, int ld, const int* idx, int cols, float* out) {
  detail::pdl_wait();
  detail::pdl_trigger();
  const float4* src = reinterpret_cast<const float4*>(x + (size_t)idx[blockIdx.x] * ld);
  float4* dst = reinterpret_cast<float4*>(out + (size_t)blockIdx.x * cols);
  for (int i = threadIdx.x; i < cols / 4; i += blockDim.x) dst[i] = src[i];
}

// Eight outputs per thread: 16-byte loads of the gate and the up halves, one 16-byte store.
__global__ void gated_act_kernel(const uint16_t* gu, int ldgu, int hid, int act, uint16_t* out,
                                 int ldo) {
  detail::pdl_wait();  // gu comes from the gate/up GEMM
  detail::pdl_trigger();
  const int row = blockIdx.y, c = 8 * (blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= hid) return;
  const uint16_t* g = gu + (size_t)row * ldgu + c;
  const uint4 gv = *reinterpret_cast<const uint4*>(g);
  const uint4 uv = *reinterpret_cast<const uint4*>(g + hid);
  const __half2* gh = reinterpret_cast<const __half2*>(&gv);
  const __half2* uh = reinterpret_cast<const __half2*>(&uv);
  uint4 o;
  uint32_t* op = reinterpret_cast<uint32_t*>(&o);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 gf = __half22float2(gh[i]), uf = __half22float2(uh[i]);
    op[i] = pack_half2(gate_act(gf.x, act) * uf.x, gate_act(gf.y, act) * uf.y);
  }
  *reinterpret_cast<uint4*>(out + (size_t)row * ldo + c) = o;
}

// One thread per (row, token) over a grid-stride loop; rows without a mask return at once.
__global__ void mask_logits_kernel(float* logits, int ld, int vocab, const int* mask_idx,
                                   const uint32_t* masks, int words) {
  detail::pdl_wait();  // logits come from the lm_head
  detail::pdl_trigger();
  const int r = blockIdx.y, m = mask_idx[r];
  if (m < 0) return;
  const uint32_t* mk = masks + (size_t)m * words;
  float* row = logits + (size_t)r * ld;
  for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < vocab; t += gridDim.x * blockDim.x)
    if (!((mk[t >> 5] >> (t & 31)) & 1u)) row[t] = -INFINITY;
}

}  // namespace

void mask_logits(float* logits, int ld, int vocab, int rows, const int* mask_idx,
                 const uint32_t* masks, int words, const Launch& s) {
  if (!logits || !mask_idx || !masks || rows <= 0 || vocab <= 0 || ld < vocab ||
      words < (vocab + 31) / 32)
    fail("mask_logits: bad arguments rows=", rows, " vocab=", vocab, " words=", words);
  constexpr int kThreads = 256;
  const int blocks = std::min((vocab + kThreads - 1) / kThreads, 32);
  detail::launch_pdl(mask_logits_kernel, dim3(blocks, rows), dim3(kThreads), s, logits, ld, vocab,
                     mask_idx, masks, words);
}

void gated_act(const uint16_t* gu, int ldgu, int n, int hid, int act, uint16_t* out, int ldo,
               const Launch& s) {
  auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  if (n <= 0 || hid <= 0 || hid % 8 || ldgu % 8 || ldgu < 2 * hid || ldo % 8 || ldo < hid || !gu ||
      !out || !aligned(gu) || !aligned(out))
    fail("gated_act: bad arguments rows=", n, " hid=", hid, " ldgu=", ldgu, " ldo=", ldo);
  constexpr int kThreads = 128;
  const int per_row = hid / 8;
  detail::launch_pdl(gated_act_kernel, dim3((per_row + kThreads - 1) / kThreads, n), dim3(kThreads),
                     s, gu, ldgu, hid, act, out, ldo);
}

void gather_rows(const float* x, int ld, const int* idx, int m, int cols, float* out,
                 const Launch& s) {
  if (m <= 0 || cols <= 0 || cols % 4 != 0 || ld % 4 != 0 || ld < cols || !x || !idx || !out)
    fail("gather_rows: bad arguments rows=", m, " cols=", cols, " ld=", ld);
  detail::launch_pdl(gather_rows_kernel, dim3(m), dim3(128), s, x, ld, idx, cols, out);
}

void argmax_rows(const float* logits, int ld, int n_cols, int n_rows, int* out, const Launch& s) {
  if (n_rows <= 0 || n_rows > 65535 || n_cols <= 0 || ld < n_cols || !logits || !out)
    fail("argmax_rows: bad arguments rows=", n_rows, " cols=", n_cols, " ld=", ld);
  const bool vec = ld % 4 == 0 && (reinterpret_cast<uintptr_t>(logits) & 15) == 0;
  detail::launch_pdl(argmax_rows_kernel, dim3(kRowSplit, (unsigned)n_rows), dim3(kRowThreads), s,
                     logits, ld, n_cols, out, vec);
}

}  // namespace smolrt::cuda
