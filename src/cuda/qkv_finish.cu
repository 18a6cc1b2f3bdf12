// Bias + per-head norm + RoPE + KV write (see qkv_finish.h): one block per head and group of rows,
// blockDim (head threads, rows): one thread per element of the head, a group's rows side by side.
#include "cuda/qkv_finish.h"

#include <cuda_fp16.h>

#include <algorithm>

#include "core/error.h"
#include "cuda/device_common.cuh"
#include "cuda/launch.h"

namespace smolrt::cuda {
namespace {

constexpr int kMaxHeadDim = 256;
// Threads per block: a head's width rounded up to a warp, times the rows of a group. A group's rows
// run side by side: a chain of rows per warp leaves an SM few warps, stalled on shared-memory round
// trips and barriers. A block takes several groups in turn (iters) only when the grid would pass
// a few resident waves, so long chunks compute each thread's RoPE frequency fewer times.
constexpr int kThreads = 256, kMaxIters = 4;

__global__ void __launch_bounds__(kThreads) qkv_finish_kernel(const QkvFinishArgs a, int iters) {
  __shared__ float sv[kThreads];         // the rows' head vectors, [row of group][head thread]
  __shared__ float part[kThreads / 32];  // per-warp sums of squares (the norm)
  const int hd = a.head_dim, d = threadIdx.x, ht = blockDim.x, rr = threadIdx.y;
  const int head = blockIdx.x;  // [0, n_heads): Q, then n_kv_heads of K, then of V
  const int seg = head < a.n_heads ? 0 : head < a.n_heads + a.n_kv_heads ? 1 : 2;
  const int hh = seg == 0 ? head : seg == 1 ? head - a.n_heads : head - a.n_heads - a.n_kv_heads;
  const bool on = d < hd;
  const size_t kv_dim = (size_t)a.n_kv_heads * hd;
  const float* bias = seg == 0 ? a.bq : seg == 1 ? a.bk : a.bv;
  const float* nw = seg == 0 ? a.q_norm : a.k_norm;
  // This thread's RoPE pair (i, partner): normal RoPE rotates (2i, 2i+1), NeoX (i, i +
  // rope_dim/2); its frequency (weights only: before the wait).
  const int half = a.rope_dim / 2;
  const int i = a.neox ? (d < half ? d : d - half) : d / 2;
  const bool first = a.neox ? d < half : (d & 1) == 0;
  const int partner = a.neox ? (first ? d + half : d - half) : d ^ 1;
  float freq = 0.f;
  if (on && seg < 2 && d < a.rope_dim) {
    freq = rope_inv_freq(i, a.rope_dim, a.rope_base);
    if (a.freq_factors) freq /= a.freq_factors[i];
  }
  const float b = on && bias ? bias[hh * hd + d] : 0.f;
  const float w = on && nw ? nw[d] : 0.f;
  pdl_wait();
  pdl_trigger();
  for (int it = 0; it < iters; ++it) {
    const int row = (blockIdx.y * iters + it) * blockDim.y + rr;
    const bool live = on && row < a.n;  // spare rows of the last group: the barriers only
    const bool rot = live && seg < 2 && d < a.rope_dim;
    int pos = 0;
    size_t cache_at = 0;
    float x = 0.f;
    if (live) {
      pos = a.row_pos ? a.row_pos[row] : a.pos0 + row;
      const int crow = a.row_slot ? a.row_slot[row] : cache_row(pos, a.ring);
      cache_at = (size_t)crow * kv_dim + hh * hd + d;
      const float* src =
          seg == 0 ? a.q + (size_t)row * a.ldq : (seg == 1 ? a.k : a.v) + (size_t)row * a.ldkv;
      x = src[hh * hd + d] + b;
    }
    auto store = [&](void* cache) {
      if (a.kv_half) {
        static_cast<__half*>(cache)[cache_at] = __float2half_rn(x);
      } else {
        static_cast<float*>(cache)[cache_at] = x;
      }
    };
    if (seg == 2) {  // V: bias only (a whole block is V or not: no barrier below is skipped)
      if (live) store(a.v_cache);
      continue;
    }
    const int tid = rr * ht + d;  // a row's threads are whole warps [rr * ht, (rr + 1) * ht)
    if (nw) {                     // per-head RMSNorm (the whole block takes this branch or none)
      const float ss = warp_sum(x * x);
      if ((d & 31) == 0) part[tid >> 5] = ss;
      __syncthreads();
      float total = 0.f;
      for (int k = 0; k < ht / 32; ++k) total += part[rr * (ht / 32) + k];
      x = live ? x * rsqrtf(total / (float)hd + a.eps) * w : 0.f;
    }
    sv[tid] = x;
    __syncthreads();
    if (rot) {
      float sn, cs;
      sincosf((float)pos * freq, &sn, &cs);
      const float y = sv[rr * ht + partner];
      x = first ? x * cs - y * sn : y * sn + x * cs;
    }
    if (live) {
      if (seg == 0)
        a.q[(size_t)row * a.ldq + hh * hd + d] = x;
      else
        store(a.k_cache);
    }
    __syncthreads();  // sv and part are rewritten by the next group
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
  if (a.ring < 0 || (a.ring > 0 && a.row_slot))
    fail("qkv_finish: ring ", a.ring, " with row slots");
  const int ht = (a.head_dim + 31) / 32 * 32, rows = kThreads / ht;
  const int heads = a.n_heads + 2 * a.n_kv_heads;
  const long threads = (long)a.n * heads * ht, resident = (long)sm_count() * 2048;
  const int iters = (int)std::clamp<long>((threads + resident - 1) / resident, 1, kMaxIters);
  launch_kernel(qkv_finish_kernel, dim3(heads, (a.n + rows * iters - 1) / (rows * iters)),
                dim3(ht, rows), 0, s, a, iters);
}

}  // namespace smolrt::cuda
