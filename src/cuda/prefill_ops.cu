// argmax_rows (see prefill_ops.h).
#include "cuda/prefill_ops.h"

#include <algorithm>
#include <climits>
#include <cmath>

#include "core/cuda_check.h"
#include "core/error.h"
#include "cuda/argmax_block.cuh"
#include "cuda/device_common.cuh"
#include "cuda/launch.cuh"

namespace smolrt::cuda {
namespace {

__global__ void __launch_bounds__(1024)
    argmax_rows_kernel(const float* logits, int ld, int n, int* out) {
  detail::pdl_wait();  // logits come from the lm_head GEMM
  detail::pdl_trigger();
  const float* row = logits + (size_t)blockIdx.x * ld;
  float bv = 0.f;
  int bi = INT_MAX;
  amax_scan(row, threadIdx.x, n, blockDim.x, bv, bi);
  __shared__ float sv[32];
  __shared__ int si[32];
  block_argmax<1024>(bv, bi, sv, si);
  if (threadIdx.x == 0) out[blockIdx.x] = bi == INT_MAX ? 0 : bi;  // all NaN: 0
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
  if (n_rows <= 0 || n_cols <= 0 || ld < n_cols || !logits || !out)
    fail("argmax_rows: bad arguments rows=", n_rows, " cols=", n_cols);
  detail::launch_pdl(argmax_rows_kernel, dim3(n_rows), dim3(1024), s, logits, ld, n_cols, out);
}

}  // namespace smolrt::cuda
