// Attention for a multi-sequence step over a paged KV pool: every row of the step is one query
// token of some sequence at some position; it attends to positions [0, pos] of its own sequence,
// found through that sequence's block table (position p -> pool slot
// tables[seq * table_stride + p / page_size] * page_size + p % page_size; page_size a power of
// two). Rows of one sequence's
// prompt chunk are causal by their own positions, since the step's QKV GEMM wrote all their K/V
// rows before this kernel runs.
//
// One block per (row, KV head, split): the query heads sharing a KV head read each K/V row once,
// and a context is cut into at most `splits` (<= kAttnPagedSplits) splits of >= 4 tiles of 32
// positions (flash-decoding style; the last block of a (row, KV head) to finish combines the
// splits' partials), so a short served batch still spreads over the GPU. Any `splits` gives the
// same result up to rounding; the caller sizes it to the step's longest context
// (attn_paged_splits), since blocks past a row's last split have nothing to do. Each of the block's
// 4 warps takes one tile at a time (8 warps and half the splits where that grid fits one resident
// wave, 2 warps where the 4-warp grid passes one: attention_paged.cu's wide and narrow builds):
// its K and V rows are copied into shared memory as fp16 (cp.async, coalesced), the scores and
// P V run on tensor cores with the group's query heads as the rows of the mma (q, K, V and P
// rounded to fp16, fp32 accumulation), an online softmax per head; the warps' states are combined
// at the end of the block.
#pragma once

#include <cuda_runtime.h>

#include <bit>
#include <cstdint>

#include "cuda/launch.h"

namespace smolrt::cuda {

// A page of the paged pools holds a power of two of rows, so the kernels find a position's row
// with shifts (attention_paged, and attention_decode over a block table check it).
inline bool is_pow2(int n) {
  return n > 0 && std::has_single_bit(static_cast<unsigned>(n));
}

// Rows whose sequences share their first keys: cascade attention (FlashInfer's cascade
// inference). Rows whose sequences hold the same pages at the start of their block tables (a
// prompt prefix cached once, then shared) read those keys once for all of them, where
// attention_paged reads a row's context once per row. With row_skip set, attention_paged runs the
// shared pass in the same launch, beside the rest: one block per (query block of a group, KV
// head, split of the shared keys), the group's query rows (a member's query heads of the KV head)
// the rows of the mma, 16 per warp, against 32-key tiles staged in shared memory for all the
// block's warps (cp.async, 4 tiles in flight, the first 4 before the PDL wait: the shared keys
// were written by earlier steps), each writing its partials to `prefix`; the blocks of the other
// keys of each row fold them in when they are complete (`counters`).
struct SharedPrefix {
  // Device [..] by row (the rows index it as they index q), or null (no cascade): keys [0,
  // row_skip) of the row are the shared pass's, so attention_paged reads keys [row_skip, pos]
  // alone and folds those partials into its softmax. A row's skip is a multiple of kSharedTile, at
  // most its row_first_new, 0 for a row outside the groups; no sliding window (window 0).
  const int* row_skip = nullptr;
  // Scratch [rows][n_heads][kAttnSharedSplits][head_dim + 2]: per split of the shared keys, the
  // base-2 running max, the sum of exponentials and the unnormalized output.
  float* prefix = nullptr;
  // Scratch [rows][n_heads] ints, zero before the first launch (the kernel leaves them zero): the
  // shared splits finished per (row, query head).
  int* counters = nullptr;
  // The shared pass's work, staged by the host (read on the device, so one captured launch serves
  // any groups): groups, kSharedGroupInts each {table row holding the shared pages, shared keys (a
  // multiple of kSharedTile), first member, members}; members: the rows of q; blocks: {count, then
  // per block: group << 16 | query block}, a query block being kSharedQueryRows of the group's
  // (member, query head of the KV head) pairs, member-major. max_blocks: the grid's block slots
  // (those past the count return at once).
  const int* groups = nullptr;
  const int* members = nullptr;
  const int* blocks = nullptr;
  int max_blocks = 0;
};

constexpr int kAttnPagedSplits = 8;    // blocks per (row, KV head) at most
constexpr int kAttnPagedMaxGroup = 8;  // query heads per KV head at most

struct PagedAttnArgs {
  const float* q = nullptr;  // device [n][ldq], roped; head h at columns [h*head_dim, ...)
  int ldq = 0;
  const void* k_pool = nullptr;  // device [slots][n_kv_heads*head_dim] of this layer
  const void* v_pool = nullptr;
  bool kv_half = false;  // pool element type: fp16 or fp32
  // device [n][ldo]: fp32 into out, or fp16 into out_h (set exactly one; fp16 feeds the dense
  // GEMMs' input as is, without a conversion launch)
  float* out = nullptr;
  uint16_t* out_h = nullptr;
  int ldo = 0;
  int n = 0;  // rows (>= 1): the grid's, and with `rows` that list's length
  // device [n] or null (block row x runs row x): block row x runs row rows[x], none where < 0 (a
  // step whose prompt chunks take attention_prefill lists the other rows here); the rows index
  // q, out, the row arrays and the scratch, which the caller sizes for the largest.
  const int* rows = nullptr;
  const int* row_pos = nullptr;  // device [n]: the row's position (attends to [0, pos])
  const int* row_seq = nullptr;  // device [n]: the row's block-table row
  // device [n] or null (0 for every row): the first position of the row's sequence that this
  // step writes. Rows, positions and tables are the host's (staged before the step), and K/V rows
  // below row_first_new were written by earlier steps: the kernel reads those before its PDL wait.
  const int* row_first_new = nullptr;
  const int* tables = nullptr;  // device [..][table_stride] page ids
  int table_stride = 0, page_size = 0;
  int window = 0;  // > 0: only keys [pos - window + 1, pos] (a sliding-window layer)
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;  // head_dim in {8, 16, 32, 64, 128, 256}
  float scale = 0.f;                              // 0: 1/sqrt(head_dim)
  int splits = kAttnPagedSplits;                  // blocks per (row, KV head), 1..kAttnPagedSplits
  // Scratch: partials [n][n_heads][kAttnPagedSplits][head_dim + 2] floats; counters
  // [n][n_kv_heads] ints, zero before the first launch (the kernel leaves them zero).
  float* partials = nullptr;
  int* counters = nullptr;
  SharedPrefix shared;  // cascade attention (row_skip null: none)
};

void attention_paged(const PagedAttnArgs& a, const Launch& stream);

// The shared pass's shape (SharedPrefix).
constexpr int kAttnSharedSplits = 8;  // splits of a group's shared keys at most
constexpr int kSharedGroupInts = 4;
constexpr int kSharedQueryRows = 64;  // query rows per block (4 warps of 16)
constexpr int kSharedTile = 32;       // keys per tile; shared keys come in whole tiles

// The splits of a shared range of `tiles` tiles (>= 1): at least 4 tiles each, at most
// kAttnSharedSplits, in `per` tiles each (the last may hold fewer); both passes compute it from
// the row's skip.
constexpr int shared_splits(int tiles, int* per) {
  const int want =
      tiles / 4 < 1 ? 1 : (tiles / 4 > kAttnSharedSplits ? kAttnSharedSplits : tiles / 4);
  *per = (tiles + want - 1) / want;
  return (tiles + *per - 1) / *per;
}

// The splits worth launching for a step of `pairs` (row, KV head) pairs whose longest context is
// max_pos + 1 positions, on a GPU of `sms` SMs: one per 4 tiles of 32 positions, rounded up to a
// power of two (few distinct graphs), at most kAttnPagedSplits, and halved while the grid would
// pass one resident wave (kAttnPagedWavePerSm blocks per SM): past it more splits only add waves
// and the combine, so short contexts and large batches take fewer splits. (6: the blocks per SM
// of the SIMT kernel's occupancy build this wave size was tuned with.)
constexpr int kAttnPagedWavePerSm = 6;
int attn_paged_splits(int max_pos, int pairs, int sms);

// head_dim 8..256 (powers of two) and n_heads / n_kv_heads <= kAttnPagedMaxGroup.
bool attention_paged_supports(int head_dim, int group);

}  // namespace smolrt::cuda
