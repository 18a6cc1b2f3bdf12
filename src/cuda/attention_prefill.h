// Causal grouped-query attention over a whole prompt chunk in one launch (flash-attention-style:
// key/value tiles staged in shared memory, online softmax, no score matrix in memory).
// head_dim 16/32/64/128/256: tensor cores (attention_prefill_tc.cu; Q, K, V and P rounded to
// fp16, fp32 accumulation, ~1e-3 relative); head_dim 8: fp32 SIMT kernel.
//
// Query i of the chunk sits at absolute position start + i and attends to keys
// (start + i - window, start + i] (window 0: [0, start + i]); keys [0, start) are already in the
// cache from earlier chunks or turns, keys [start, start + n_tokens) were written there by this
// chunk's QKV GEMM (gemm QkvRope) or qkv_finish. Key tiles wholly outside every query's window
// are skipped, not masked.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/launch.h"
#ifdef __CUDACC__
#include "cuda/device_common.cuh"
#endif

namespace smolrt::cuda {

struct AttentionPrefillArgs {
  const float* q = nullptr;  // device [n_tokens][ldq]; head h at columns [h*head_dim, ...)
  int ldq = 0;
  const void* k_cache =
      nullptr;  // device [n_ctx][kv_dim] for this layer (kv_dim = n_kv_heads*head_dim)
  const void* v_cache = nullptr;  // same layout
  bool kv_half = true;            // cache element type: fp16 (true) or fp32
  // device [n_tokens][ldo], head h at columns [h*head_dim, ...): fp32 into out, or fp16 into
  // out_h (set exactly one; fp16 feeds the dense GEMMs' input as is)
  float* out = nullptr;
  uint16_t* out_h = nullptr;
  int ldo = 0;
  int n_tokens = 0;                 // queries in this chunk (>= 1)
  int start = 0;                    // absolute position of query 0 (>= 0)
  int n_heads = 0, n_kv_heads = 0;  // query head h reads KV head h / (n_heads / n_kv_heads)
  int head_dim = 0;                 // 8, 16, 32, 64, 128 or 256 (anything else: Error)
  int window = 0;                   // sliding window (gemma3 local layers); 0 = none
  // ring > 0: the caches hold `ring` rows, key t at row t % ring (a sliding-window layer's
  // cache; ring >= window + n_tokens - 1, so no key the chunk needs was overwritten).
  int ring = 0;
  // table != nullptr: the caches are a paged pool (the multi-sequence engine's) and key t is at
  // row table[t / page_size] * page_size + t % page_size (device table of the sequence's pages;
  // page_size a power of two; ring 0: a ring is a table that repeats its pages).
  const int* table = nullptr;
  int page_size = 0;
  // With a table: its pages are consecutive (table[i] = table[0] + i, as the engine keeps a lone
  // sequence's), so key t is at row table[0] * page_size + t: no table read per key.
  // With spans: they may be, and each span's fourth int says whether they are.
  bool contiguous = false;
  // spans != nullptr: the queries are prompt chunks of sequences in a paged pool (the rows of a
  // multi-sequence step), read when the kernel runs, so one captured launch serves any chunks (a
  // graph replayed for other chunks, lengths and positions). spans: device int[kPrefillSpanInts]
  // per chunk {start, n_tokens, table row, consecutive pages (0/1), its first row of q and out};
  // tiles: device {count, then per query tile (attention_prefill_query_tile(head_dim) queries):
  // span index << 16 | the tile's index in its span}. max_tiles sizes the grid (tiles past the
  // count do nothing); n_tokens is then the rows of q and out (the partials' rows) and start is
  // ignored; the page table of a chunk is table + table row * table_stride; rows of no chunk stay
  // untouched.
  const int* spans = nullptr;
  const int* tiles = nullptr;
  int max_tiles = 0;
  int table_stride = 0;
  float scale = 0.f;  // softmax scale of q.k; 0 = 1/sqrt(head_dim)
  // Scratch for key splits (head_dim 128/256): attention_prefill_scratch floats, or nullptr (one
  // block per query tile and head; short chunks then use a fraction of the GPU).
  float* partials = nullptr;
};

constexpr int kPrefillSpanInts = 5;  // AttentionPrefillArgs::spans, per chunk

// Queries per tile of AttentionPrefillArgs::tiles (the kernels' query block for this head_dim).
constexpr int attention_prefill_query_tile(int head_dim) {
  return head_dim == 8 ? 16 : 64;
}

#ifdef __CUDACC__
// The chunk a block runs: its start, its queries, its page table, its first row of q and out and,
// for consecutive pages, the row of key 0.
struct PrefillSpan {
  int start, n_tokens;
  const int* table;
  bool run;  // consecutive pages: key t at row base + t
  int base;
  int row0;
};
// Query tile t (of bq queries) of the launch: its chunk and first query (q0, relative to the
// chunk); false when the tile has nothing to do. Without spans tile t holds queries [t*bq, ..).
__device__ __forceinline__ bool prefill_tile(const AttentionPrefillArgs& a, int t, int bq,
                                             PrefillSpan& sp, int& q0) {
  sp = PrefillSpan{a.start, a.n_tokens, a.table, a.contiguous, 0, 0};
  q0 = t * bq;
  if (a.spans) {
    if (t >= a.tiles[0]) return false;
    const int e = a.tiles[1 + t];
    const int* s = a.spans + (e >> 16) * kPrefillSpanInts;
    sp.start = s[0], sp.n_tokens = s[1], sp.run = a.contiguous && s[3] != 0, sp.row0 = s[4];
    sp.table = a.table + (size_t)s[2] * a.table_stride;
    q0 = (e & 0xffff) * bq;
  }
  if (sp.table) sp.base = sp.table[0] * a.page_size;
  return q0 < sp.n_tokens;
}
// The cache row of key t (the kernels' addressing: consecutive pages, a page table, a ring, or
// the position).
__device__ __forceinline__ int key_row(const AttentionPrefillArgs& a, const PrefillSpan& sp,
                                       int t) {
  if (sp.table) {
    if (sp.run) return sp.base + t;
    const int sh = __ffs(a.page_size) - 1;
    return sp.table[t >> sh] * a.page_size + (t & (a.page_size - 1));
  }
  return cache_row(t, a.ring);
}
#endif

constexpr int kAttnPrefillSplits = 4;  // key splits per query tile at most

// Floats of AttentionPrefillArgs::partials for chunks of up to n_tokens (0: no splits taken).
inline size_t attention_prefill_scratch(int n_tokens, int n_heads, int head_dim) {
  return head_dim > 64 ? (size_t)kAttnPrefillSplits * n_tokens * n_heads * (head_dim + 2) : 0;
}

// Checks the arguments (smolrt::Error naming the field) and the launch.
void attention_prefill(const AttentionPrefillArgs& a, const Launch& stream);

// True when attention_prefill supports this head_dim (callers fall back to per-token attention).
bool attention_prefill_supports(int head_dim);

}  // namespace smolrt::cuda
