// Decode attention (one query token) over a KV cache of any length up to n_ctx, flash-decoding
// style. The context [0, *pos] is cut into at most kAttnMaxSplits splits of C positions (C a
// multiple of kAttnSub, chosen on the device from *pos, so one captured graph serves every
// position); one block per (head, split) runs an online softmax over 32-position sub-chunks and
// writes a partial (max m, sum l, unnormalized acc[head_dim]); the last block of each head to
// finish (atomic counter) combines the partials. Splits past the context exit at once.
#pragma once

#include <cuda_runtime.h>

#include "cuda/dev_mat.h"
#include "cuda/launch.h"

namespace smolrt::cuda {

constexpr int kAttnSub = 128;       // positions scored together (one per 4 threads)
constexpr int kAttnMaxSplits = 16;  // blocks per head at most

// Positions one block scores together: kAttnSub, or a quarter of it for head_dim 256 (16 threads
// per position then, so the K, Q and V registers per thread stay at 16 each).
constexpr int attn_sub(int head_dim) {
  return head_dim > 128 ? kAttnSub / 4 : kAttnSub;
}

// Blocks per head for contexts up to n_ctx: one per sub-chunk, at most kAttnMaxSplits.
inline int attn_splits(int n_ctx, int head_dim) {
  const int sub = attn_sub(head_dim);
  const int subs = (n_ctx + sub - 1) / sub;
  return subs < kAttnMaxSplits ? subs : kAttnMaxSplits;
}

// Scratch for one attention launch (reused by every layer; launches are serialized).
//   partials: [n_heads][attn_splits(n_ctx, head_dim)][head_dim + 2] floats
//   counters: [n_heads] ints, zero before the first launch; the kernel leaves them zero.
struct AttnScratch {
  float* partials = nullptr;
  int* counters = nullptr;
};

// q: [n_heads*head_dim] (already rotated); k_cache, v_cache: [n_ctx][n_kv_heads*head_dim] for
// this layer; pos: device pointer, attends to positions [0, *pos]; out: [n_heads*head_dim].
// head_dim in {4, 8, 16, 32, 64, 128, 256}; n_heads a multiple of n_kv_heads; *pos < n_ctx.
// With pages.tables set the caches are a paged pool ([slots][kv_dim]) and position t lives in
// row tb[t / page] * page + t % page, tb = tables + *seq * stride (the sequence's block table;
// *seq is read from device memory like *pos), or with seq null tb = tables (a table of `stride`
// entries staged with the step, the faster form): the multi-sequence backend's one-row steps.
// pages.half: the pool holds fp16 K/V (the multi-sequence backend's fp16 pool), else fp32.
// consecutive (optional): a device flag read like *pos; nonzero says the sequence's pages are
// consecutive (tb[i] = tb[0] + i, as the engine keeps a lone sequence's), so position
// t lives in row tb[0] * page + t: one load instead of staging the table.
struct AttnPages {
  const int* tables = nullptr;
  const int* seq = nullptr;
  int stride = 0, page = 0;
  bool half = false;
  const int* consecutive = nullptr;
};
// window > 0: only the last `window` positions [*pos - window + 1, *pos] (a sliding-window
// layer; keys before are never read). scale: the softmax scale, 0 = 1/sqrt(head_dim).
// ring > 0 (no block table): the caches hold `ring` rows, position t at row t % ring — a
// sliding-window layer's cache capped at window + the prefill chunk (ring > window).
void attention_decode(float* out, const float* q, const void* k_cache, const void* v_cache,
                      const int* pos, int n_ctx, int n_heads, int n_kv_heads, int head_dim,
                      const AttnScratch& scratch, const Launch& s, const AttnPages& pages = {},
                      int window = 0, float scale = 0.f, int ring = 0);

}  // namespace smolrt::cuda
