// Bias + per-head norm + RoPE + KV write (see qkv_finish.h): one block per head and group of
// kRowsPerBlock tokens, one thread per element of the head.
#include "cuda/qkv_finish.h"

#include <cuda_fp16.h>

#include "core/error.h"
#include "cuda/device_common.cuh"
#include "cuda/launch.h"

namespace smolrt::cuda {
namespace {

constexpr int kMaxHeadDim = 256;
// Rows per block: blocks of one head's width are small, so one block per row would be bound by
// the rate at which blocks launch; a block takes its head in several rows and computes the RoPE
// frequencies once for them.
constexpr int kRowsPerBlock = 8;

__global__ void __launch_bounds__(kMaxHeadDim) qkv_finish_kernel(const QkvFinishArgs a) {
  __shared__ float sv[kMaxHeadDim];
  __shared__ float part[kMaxHeadDim / 32];
  const int hd = a.head_dim, d = threadIdx.x;
  const int head = blockIdx.x;  // [0, n_heads): Q, then n_kv_heads of K, then of V
  const int seg = head < a.n_heads ? 0 : head < a.n_heads + a.n_kv_heads ? 1 : 2;
  const int hh = seg == 0 ? head : seg == 1 ? head - a.n_heads : head - a.n_heads - a.n_kv_heads;
  const bool on = d < hd;
  const size_t kv_dim = (size_t)a.n_kv_heads * hd;
  const float* bias = seg == 0 ? a.bq : seg == 1 ? a.bk : a.bv;
  const float* nw = seg == 0 ? a.q_norm : a.k_norm;
  // This thread's RoPE pair (i, partner): normal RoPE rotates (2i, 2i+1), NeoX (i, i +
  // rope_dim/2); its frequency (weights only: before the wait).
  const bool rot = on && seg < 2 && d < a.rope_dim;
  const int half = a.rope_dim / 2;
  const int i = a.neox ? (d < half ? d : d - half) : d / 2;
  const bool first = a.neox ? d < half : (d & 1) == 0;
  const int partner = a.neox ? (first ? d + half : d - half) : d ^ 1;
  float freq = 0.f;
  if (rot) {
    freq = rope_inv_freq(i, a.rope_dim, a.rope_base);
    if (a.freq_factors) freq /= a.freq_factors[i];
  }
  const float b = on && bias ? bias[hh * hd + d] : 0.f;
  const float w = on && nw ? nw[d] : 0.f;
  pdl_wait();
  pdl_trigger();
  const int r1 = min(a.n, (int)(blockIdx.y + 1) * kRowsPerBlock);
  for (int row = blockIdx.y * kRowsPerBlock; row < r1; ++row) {
    const int pos = a.pos_dev ? *a.pos_dev : a.row_pos ? a.row_pos[row] : a.pos0 + row;
    const int crow = a.row_slot ? a.row_slot[row] : cache_row(pos, a.ring);
    const size_t cache_at = (size_t)crow * kv_dim + hh * hd + d;
    const float* src =
        seg == 0 ? a.q + (size_t)row * a.ldq : (seg == 1 ? a.k : a.v) + (size_t)row * a.ldkv;
    float x = on ? src[hh * hd + d] + b : 0.f;
    auto store = [&](void* cache) {
      if (a.kv_half) {
        static_cast<__half*>(cache)[cache_at] = __float2half_rn(x);
      } else {
        static_cast<float*>(cache)[cache_at] = x;
      }
    };
    if (seg == 2) {  // V: bias only (a whole block is V or not: no barrier below is skipped)
      if (on) store(a.v_cache);
      continue;
    }
    if (nw) {  // per-head RMSNorm (the whole block takes this branch or none)
      const float ss = warp_sum(x * x);
      if ((d & 31) == 0) part[d >> 5] = ss;
      __syncthreads();
      float total = 0.f;
      for (int k = 0; k < (blockDim.x + 31) / 32; ++k) total += part[k];
      x = on ? x * rsqrtf(total / (float)hd + a.eps) * w : 0.f;
    }
    if (on) sv[d] = x;
    __syncthreads();
    if (rot) {
      float sn, cs;
      sincosf((float)pos * freq, &sn, &cs);
      const float y = sv[partner];
      x = first ? x * cs - y * sn : y * sn + x * cs;
    }
    if (on) {
      if (seg == 0)
        a.q[(size_t)row * a.ldq + hh * hd + d] = x;
      else
        store(a.k_cache);
    }
    __syncthreads();  // sv and part are rewritten by the next row
  }
}

}  // namespace

void qkv_finish(const QkvFinishArgs& a, const Launch& s) {
  if (!a.q || !a.k || !a.v || !a.k_cache || !a.v_cache) fail("qkv_finish: null pointer");
  if (a.n <= 0 || a.n_heads <= 0 || a.n_kv_heads <= 0 || a.head_dim <= 0 || a.head_dim % 2 ||
      a.head_dim > kMaxHeadDim || a.rope_dim < 0 || a.rope_dim % 2 || a.rope_dim > a.head_dim)
    fail("qkv_finish: bad shape (rows ", a.n, ", heads ", a.n_heads, "/", a.n_kv_heads,
         ", head_dim ", a.head_dim, ", rope_dim ", a.rope_dim, "); head_dim is at most ",
         kMaxHeadDim);
  if (a.ldq < a.n_heads * a.head_dim || a.ldkv < a.n_kv_heads * a.head_dim)
    fail("qkv_finish: ldq/ldkv smaller than the heads' width");
  if (a.pos_dev && a.n != 1) fail("qkv_finish: a device position slot serves one row only");
  if (a.ring < 0 || (a.ring > 0 && a.row_slot))
    fail("qkv_finish: ring ", a.ring, " with row slots");
  const int threads = (a.head_dim + 31) / 32 * 32;
  launch_kernel(qkv_finish_kernel,
                dim3(a.n_heads + 2 * a.n_kv_heads, (a.n + kRowsPerBlock - 1) / kRowsPerBlock),
                dim3(threads), 0, s, a);
}

}  // namespace smolrt::cuda
