// CudaBatchBackend: the multi-sequence backend (backend/batch.h) on one GPU.
//
// One step() = one pass over the weights for every row of the step (decode tokens and prompt
// chunks of many sequences together): the layer loop (step_forward with StepRows: per-row
// positions, K/V written to paged pool slots, attention over each row's own sequence), then the
// rows that need an output are gathered and go through the final norm + lm_head as one
// tensor-core GEMM, and greedy rows are argmaxed on the GPU. A one-row step (a lone sequence's
// decode) runs the same loop on the GEMVs and the split decode attention, then the lm_head GEMV
// with the argmax fused. Sampled rows run the GPU sampler (cuda/sample.h) per row; only token ids
// (and logits where asked) come back.
//
// A step whose prompt chunks read many keys (CudaOptions::span_row_keys), or a step of chunks
// alone, takes their attention as attention_prefill over their sequences' block tables: the
// tensor-core prefill kernel shares each key tile among 64 queries, where attention_paged reads a
// row's context once per row; the one-row entries take attention_paged, through a list of their
// rows. Fewer keys cost attention_paged little beside the step's decodes (its blocks fill the
// GPU's idle slots), less than a second launch. With a sequence's pages consecutive (a lone
// sequence's are: KvPages::gather) the prefill kernel finds a key's row from the first page
// alone. The attention reads the chunks' positions, lengths, sequences, rows and that flag and the
// list of rows from the step's staging (AttentionPrefillArgs::spans), so steps with other chunks
// replay their bucket's graph too.
//
// Rows whose sequences hold the same first pages (a cached prompt prefix, a fork's prompt) take
// cascade attention where enough of them share enough keys (CudaOptions::cascade_rows /
// cascade_keys): in the same attention_paged launch, the shared pass reads the shared keys once
// for the whole group (its rows' query heads as the rows of the mma) while the other blocks read
// the rest of each row's context, then fold the shared pass's partials in. The groups, their
// members and each row's skip travel in the step's staging after the spans, so the graph (keyed by
// cascade or not) serves any groups.
//
// Rows are padded up to a bucket (kBuckets) so a few shapes recur; each (rows, output rows)
// bucket (and attention split count, from the step's longest context) is captured once as a CUDA
// graph and replayed (the per-step data travel in one H2D copy of a pinned staging block before
// the launch, laid out for the step's bucket so the copy is as small as the step; the chosen ids
// come back written by the kernels straight into pinned host memory, no D2H copy). Padding rows
// are token 0 at position 0 of a scratch "sequence" whose one page is outside the pool, so they
// touch nothing real.
//
// Speculation (CudaOptions::speculate): after a one-row greedy decode step whose next token fits
// its sequence's last page, the next step of that sequence is launched before the host has read
// this one's id. Its staging is made on the device: every one-row step ends by handing off (the
// argmax writes the id as the next token and advances position, slot and first position), so the
// speculative step follows in the stream with no copy in between. A step() asking for exactly
// that (the same sequence, the id just returned, nothing but greedy) adopts it; anything else, or
// any change to the sequences in between, drops it: it still runs, but it wrote only the unused
// K/V row past its sequence's position, in a page that sequence owns (in a sliding-window ring,
// the row after the position's: a rollback then reaches one position less), and its id slot is
// its own (one-row steps alternate between two); free_sequence waits for a dropped one, so the
// next step does not queue behind it. The host's wake-up, staging and launch then overlap the GPU's
// step.
//
// Models the many-row kernels do not take (an F32 matrix, a shape off the GEMM tiles, such as
// stories260K) run every step as one row (max_step_tokens() 1): the decode kernels take any shape.
//
// Weights: one device image (upload_weights), read by the GEMVs and the GEMMs as is.
#include <algorithm>
#include <climits>
#include <cstring>
#include <map>
#include <tuple>

#include "backend/batch.h"
#include "backend/cpu/sample.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_weights.h"
#include "backend/cuda/prefill_model.h"
#include "backend/kv_pages.h"
#include "core/cuda_check.h"
#include "core/error.h"
#include "cuda/argmax.h"
#include "cuda/attention_decode.h"
#include "cuda/attention_paged.h"
#include "cuda/attention_prefill.h"
#include "cuda/device_buffer.h"
#include "cuda/embed.h"
#include "cuda/gemm.h"
#include "cuda/gemv.h"
#include "cuda/launch.h"
#include "cuda/prefill_ops.h"
#include "cuda/sample.h"

namespace smolrt {

namespace {

// Row counts a step is padded to (graph buckets).
constexpr int kBuckets[] = {1,   2,   4,   8,   16,  24,  32,   48,   64,  96,
                            128, 192, 256, 384, 512, 768, 1024, 1536, 2048};

int bucket(int n) {
  for (int b : kBuckets)
    if (b >= n) return b;
  return n;
}

// A step of prompt chunks alone (no one-row entries: attention_prefill is then its only attention
// launch) takes attention_prefill from this many rows on, below CudaOptions::span_row_keys. Not a
// measured crossover (a lone 32-token prompt measured the same with 2).
constexpr int kChunkAttnRows = 64;

// A many-row step shape is recorded as a graph at its this-many-th step (launch()).
constexpr int kGraphAfterRuns = 3;

// Cascade attention (CudaOptions::cascade_rows): at most this many groups of rows sharing a prefix
// per step (block slots of the shared pass), in steps of at most kCascadeMaxRows rows (its
// scratch).
constexpr int kCascadeGroups = 8;
constexpr int kCascadeMaxRows = 512;

class CudaBatchBackend final : public BatchBackend {
 public:
  CudaBatchBackend(const Model& m, const BatchOptions& opt, const CudaOptions& co);
  ~CudaBatchBackend() override;

  std::string name() const override { return "cuda"; }
  std::string device_name() const override;
  double copy_bandwidth_gbs() override;
  const ModelConfig& config() const override { return c_; }
  int max_step_tokens() const override { return max_step_; }
  int kv_ring_rows() const override { return ring_pages_ * kv_->page_size(); }
  int64_t steps_ahead() const override { return adopted_; }
  int64_t graph_captures() const override { return captures_; }
  int64_t shared_prefix_rows() const override { return cascaded_; }
  int dense_rows() const override {
    return pw_.dense() && pw_.dense_rows != INT_MAX ? pw_.dense_rows : 0;
  }

  // A pending speculative step is dropped where its sequence's id, position or last page may
  // change hands: here, rollback and fork (a new sequence or a prefix match takes none of them).
  void free_sequence(int seq) override {
    // A pending speculative step would run ahead of the next step (stream order) and delay it:
    // let it finish here, where nothing waits on it.
    if (spec_.on) CUDA_CHECK(cudaStreamSynchronize(stream_));
    spec_.on = false;
    BatchBackend::free_sequence(seq);
  }
  void rollback(int seq, int pos) override;
  int fork_sequence(int seq) override;

  std::vector<SeqResult> step(std::span<const SeqStep> batch) override;
  void warm_up() override;

 private:
  // What a many-row step's graph is keyed by beside its buckets.
  struct Shape {
    int splits = 0;        // attention_paged's splits (0: no rows take it)
    bool masked = false;   // rows with a token mask
    bool chunks = false;   // prompt chunks through attention_prefill (tile list and spans staged)
    bool cascade = false;  // rows sharing a prefix (the shared pass's work staged)
  };
  // The launches of one step of nb rows, mb output rows, the chosen ids to `out` (captured per
  // bucket and shape).
  void forward(int nb, int mb, const Shape& sh, int* out);
  // forward() as the shape's graph (recorded at its kGraphAfterRuns-th step; one-row steps at
  // their first), or plain launches without graphs.
  // par: which of the two id slots a one-row step writes (0 for the others).
  void launch(int nb, int mb, const Shape& sh, int par);
  // Whether the step after `batch` (just staged) is worth launching now (see the file comment);
  // with adopting, whether `batch` is such a step (its `last` aside: it may end the sequence).
  bool speculable(std::span<const SeqStep> batch, bool adopting = false) const;
  // Launches the next step of seq, its token the id the one-row step of parity `par` chooses.
  void speculate(int seq, int par);
  std::vector<SeqResult> adopt(const SeqStep& s);
  // Brings seq's row of the host table mirror up to its block table; true if it changed (the
  // step then copies the changed rows to the device in one copy).
  bool stage_tables(int seq);
  // Copies rows [src, src + n) of layer l's K and V to [dst, dst + n) (a ring).
  void copy_rows(int l, int src, int dst, int n);
  // The same in every layer that keeps the paged pool (not the rings): one 2D copy per run of
  // such layers, whose K and V lie equally spaced.
  void copy_pool_rows(int src, int dst, int n);
  // Ring slot of position pos of sequence (slot) seq in a sliding-window layer (0 without rings).
  int ring_slot(int seq, int pos) const {
    const int ps = kv_->page_size();
    return ring_pages_ ? (seq * ring_pages_ + (pos / ps) % ring_pages_) * ps + pos % ps : 0;
  }

  ModelConfig c_;
  int max_step_ = 0;
  int table_stride_ = 0;
  cuda::DeviceWeights dw_;
  cuda::DenseWeights dense_;  // fp16 copies (BatchOptions::f16_weights), else empty
  // K and V per layer: [slots + page][kv_dim] each, or for a sliding-window layer with rings
  // [(max_seqs + 1) * ring rows][kv_dim]
  cuda::DeviceBuffer pool_;
  // Sliding-window layers keep a ring of ring_pages_ pages per sequence (0: they use the paged
  // pool like the others); ring page i of sequence s is page s * ring_pages_ + i.
  int ring_pages_ = 0;
  cuda::StepWeights pw_;
  cuda::StepWorkspace ws_;
  cuda::DeviceBuffer dev_;   // staging mirror + tables + gathered rows + sampled ids + history
  cuda::PinnedBuffer host_;  // staging block, tables mirror, output ids (carve_host)
  // Staging layout (ints, both sides): one array [nb] per field for a step of bucket nb (<= cap):
  // each row's token, position, pool slot, sequence, ring slot and its sequence's first position
  // in the step; each output row's step row and mask (index into the masks, or -1); the rows
  // attention_paged runs (-1 past them); for a one-row step, whether its sequence's pages are
  // consecutive (kConsec). A one-row step's fields are followed by its sequence's block table (the
  // used entries copied), which its attention reads directly (attention_decode with a staged
  // table); a step with prompt chunks' by their tile list (its count, then up to tile_cap(nb)
  // tiles) and spans (AttentionPrefillArgs::tiles, spans).
  enum Field {
    kTok,
    kPos,
    kSlot,
    kSeq,
    kOutRow,
    kRingSlot,
    kFirstPos,
    kMaskIdx,
    kAttnRow,
    kConsec,
    kStaged
  };
  int* st_ = nullptr;
  int* d_st_ = nullptr;
  int* st(Field f, int nb) const { return st_ + f * nb; }
  const int* d_st(Field f, int nb) const { return d_st_ + f * nb; }
  // Chunks of a step of bucket nb at most (one per sequence), and their query tiles: the tile
  // slots of its prefill launch (a bound, not a graph key: the blocks past a step's tiles return
  // at once, where keying graphs by the tiles would capture more of them as chunks come).
  int span_cap(int nb) const { return std::min(nb / 2, max_seqs()); }
  // Rows of a step with chunks that attention_paged runs at most: its one-row entries.
  int attn_cap(int nb) const { return std::min(nb, max_seqs()); }
  int tile_cap(int nb) const {
    const int q = cuda::attention_prefill_query_tile(c_.head_dim);
    return (nb + q - 1) / q + span_cap(nb);
  }
  // Where a step of bucket nb stages its tile list and its spans.
  int tiles_at(int nb) const { return kStaged * nb; }
  int spans_at(int nb) const { return kStaged * nb + 1 + tile_cap(nb); }
  // The shared pass's block slots for a step of bucket nb: each group's query rows (its rows x
  // query heads per KV head) in blocks, one partial block per group at most.
  int cblock_cap(int nb) const {
    return (nb * (c_.n_heads / c_.n_kv_heads) + cuda::kSharedQueryRows - 1) /
               cuda::kSharedQueryRows +
           kCascadeGroups;
  }
  // Where a step of bucket nb stages the shared pass's work: its block list {count, slots}, the
  // groups, the members (rows), then each row's skip (PagedAttnArgs::row_skip); and the end.
  int cascade_at(int nb) const { return spans_at(nb) + cuda::kPrefillSpanInts * span_cap(nb); }
  int cgroups_at(int nb) const { return cascade_at(nb) + 1 + cblock_cap(nb); }
  int cmembers_at(int nb) const { return cgroups_at(nb) + cuda::kSharedGroupInts * kCascadeGroups; }
  int cskip_at(int nb) const { return cmembers_at(nb) + nb; }
  // Ints of staging on each side: a step of the largest bucket with all its chunks and groups, or
  // a one-row step with its table.
  size_t staged_ints(int cap) const {
    return std::max(size_t(cskip_at(cap) + cap), size_t(kStaged + table_stride_));
  }
  // Stages seq's block table after a one-row step's fields at `fields`; returns the ints to copy.
  int stage_table(int* fields, int seq) const;
  // Stages rows [from, nb) of a step of bucket nb as padding: token 0 at position 0 of the scratch
  // sequence (row max_seqs of the tables), whose one page is past the pool.
  void stage_padding(int from, int nb);
  // Rows sharing a prefix (cascade attention): entries whose tables start with the same page, the
  // keys they all hold below their first positions (p0s) in whole tiles, their rows.
  struct CascadeGroup {
    int table_row = 0, keys = 0, rows = 0;
    std::vector<int> entries;
  };
  // The groups among the entries with paged[i] (at most kCascadeGroups; those of at least
  // cascade_rows rows sharing at least cascade_keys keys).
  std::vector<CascadeGroup> cascade_groups(std::span<const SeqStep> batch,
                                           const std::vector<int>& p0s,
                                           const std::vector<char>& paged) const;
  // Cascade attention's groups for a step of bucket nb (with its entries' first positions, first
  // rows and whether their rows take attention_paged): staged, skip[i] set for the entries in
  // them; returns how many.
  int stage_cascade(int nb, std::span<const SeqStep> batch, const std::vector<int>& p0s,
                    const std::vector<int>& row0s, const std::vector<char>& paged,
                    std::vector<int>& skip);
  // Stages group g of a cascade step of bucket nb: {table row, shared keys, members [m0, m0 +
  // count) of the member list}, its query blocks after the block list's (from a count of 0).
  void stage_group(int nb, int g, int table_row, int keys, int m0, int count);
  int* tables_host_ = nullptr;  // [max_seqs + 1][table_stride]
  int* d_tables_ = nullptr;
  int* d_ring_tables_ = nullptr;  // [max_seqs + 1][table_stride]: ring pages, repeated
  float* d_xo_ = nullptr;         // [cap][dim] gathered output rows
  int* out_host_ = nullptr;       // [cap] chosen ids (pinned, written by the kernels)
  int* out1_ = nullptr;           // [2] one-row steps' chosen ids, by parity (pinned)
  // Where a step of bucket nb writes its chosen ids (par: a one-row step's id slot).
  int* ids_out(int nb, int par) const { return nb == 1 ? out1_ + par : out_host_; }
  cudaEvent_t done_[2] = {};                  // after the one-row step of each parity
  int par_ = 0;                               // parity of the last one-row step launched
  int* d_hist_ = nullptr;                     // penalty windows of the sampled rows
  cuda::SampleRow* d_sample_rows_ = nullptr;  // [max_seqs] a step's sampled rows
  uint32_t* d_sample_keys_ = nullptr;         // their keys when the vocabulary passes shared memory
  cuda::SampleRow* sample_rows_host_ = nullptr;  // their pinned staging
  uint32_t* d_masks_ = nullptr;  // [max_seqs][mask_words_] allowed-token masks of a step
  uint32_t* masks_host_ = nullptr;
  int mask_words_ = 0;
  cuda::PinnedBuffer masks_pinned_;
  float* d_partials_ = nullptr;       // attention_paged scratch
  float* d_prefix_ = nullptr;         // the shared pass's partials (kCascadeMaxRows rows)
  int* d_prefix_counters_ = nullptr;  // and its counters
  int* d_counters_ = nullptr;
  cuda::AttnScratch attn1_;    // one-row steps: the decode attention's split scratch
  float* d_part_v_ = nullptr;  // one-row lm_head's argmax partials
  int* d_part_i_ = nullptr;
  cuda::PinnedBuffer hist_pinned_;
  cuda::PinnedBuffer logits_pinned_;  // the step's logits rows read back (grown as asked)
  std::vector<int> uploaded_;         // pages of each sequence's table already on the device
  cudaStream_t stream_ = nullptr;
  // A shape's graph once recorded, and how many of its steps ran without one before.
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    int eager_runs = 0;
  };
  std::map<std::tuple<int, int, int, bool, int, bool, bool>, Graph> graphs_;
  bool use_graph_ = true;
  bool pdl_ = true, split_k_ = true, speculate_ = true;
  int64_t span_row_keys_ = 0;                // CudaOptions::span_row_keys
  int cascade_rows_ = 0, cascade_keys_ = 0;  // CudaOptions::cascade_rows, cascade_keys
  // Whether one-row steps may be speculated (graphs on, CudaOptions::speculate).
  bool speculating() const { return speculate_ && use_graph_; }
  struct {
    bool on = false;  // a launched step waits to be adopted
    int seq = 0, pos = 0, par = 0;
    int token = 0;  // the id it was fed (the previous step's, returned by step())
  } spec_;
  // How this backend's kernels are launched (its stream and options).
  cuda::Launch kernels() const { return {stream_, pdl_, split_k_}; }
  cpu::SampleScratch scratch_;
  double copy_gbs_ = 0;   // copy_bandwidth_gbs, once measured
  int64_t adopted_ = 0;   // steps_ahead()
  int64_t captures_ = 0;  // graph_captures()
  int64_t cascaded_ = 0;  // shared_prefix_rows()
};

CudaBatchBackend::CudaBatchBackend(const Model& m, const BatchOptions& opt, const CudaOptions& co)
    : c_(m.config) {
  max_step_ = opt.max_step_tokens != 0 ? opt.max_step_tokens : kCudaStepTokens;
  if (max_step_ <= 0 || max_step_ > kBuckets[std::size(kBuckets) - 1])
    fail("max step tokens ", max_step_, " is invalid: use 1..", kBuckets[std::size(kBuckets) - 1]);
  if (!cuda::is_pow2(opt.page_size))
    fail("KV page size ", opt.page_size, " is invalid for the CUDA backend: use a power of two");
  const int hd = c_.head_dim;
  if (hd < 4 || hd > 256 || !cuda::is_pow2(hd))
    fail("head_dim ", hd,
         " has no CUDA attention kernel (supported 4..256, powers of two); use --backend cpu");
  if (c_.n_kv_heads <= 0 || c_.n_heads % c_.n_kv_heads != 0)
    fail("n_heads ", c_.n_heads, " is not a multiple of n_kv_heads ", c_.n_kv_heads);
  // Steps of many rows need the GEMMs and the attention kernels of rows and chunks; a model they
  // do not take (an F32 matrix, a shape off their tiles) runs one row per step on the decode
  // kernels.
  const bool rows_ok = cuda::attention_paged_supports(hd, c_.n_heads / c_.n_kv_heads) &&
                       cuda::attention_prefill_supports(hd) && cuda::prefill_fits(c_, m.weights) &&
                       cuda::gemm_takes(m.weights.output.type) && c_.dim % 4 == 0;
  if (!rows_ok) max_step_ = 1;
  const bool f16_weights = opt.f16_weights && rows_ok;
  const int cap = bucket(max_step_);
  dw_ = cuda::upload_weights(m.weights, c_);
  // The dense copies come before the KV pool is sized from the memory left.
  if (f16_weights) dense_ = cuda::make_dense(dw_, c_);

  // KV pool: what was asked, else every sequence's full context, capped by half the free memory
  // left after the weights and the step's workspace.
  const size_t elt = opt.kv_half ? 2 : 4;
  const size_t row_bytes = 2 * size_t(c_.kv_dim()) * elt;  // K and V of one token, one layer
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const size_t ws_guess = size_t(cap) * (size_t(c_.vocab_size) + 8 * c_.hidden_dim) * 4;
  const size_t budget = free_b / 2 > ws_guess ? free_b / 2 - ws_guess : 0;
  BatchGeometry geo = batch_geometry(c_, opt, int64_t(c_.n_layers * row_bytes), int64_t(budget));
  // A sliding-window layer reads a sequence's last `window` keys only: its cache is a ring per
  // sequence (kv_pages.h's rule for steps of max_step tokens), in whole pages, when that holds
  // less than the pool.
  int n_local = 0;
  for (int l = 0; l < c_.n_layers; ++l) n_local += c_.is_swa(l) ? 1 : 0;
  if (n_local > 0 && c_.sliding_window > 0) {
    const int64_t ring = sliding_ring_rows(c_.sliding_window, max_step_);
    const int64_t rp = (ring + opt.page_size - 1) / opt.page_size;
    if (rp * opt.page_size < geo.seq_ctx && rp * opt.max_seqs < geo.n_pages) {
      ring_pages_ = int(rp);
      const size_t ring_bytes =
          size_t(n_local) * size_t(opt.max_seqs + 1) * size_t(rp * opt.page_size) * row_bytes;
      // Sized by memory: the global layers alone share what the rings leave.
      if (opt.kv_tokens == 0 && budget > ring_bytes)
        geo = batch_geometry(c_, opt, int64_t((c_.n_layers - n_local) * row_bytes),
                             int64_t(budget - ring_bytes));
    }
  }
  const int seq_ctx = geo.seq_ctx, pages = geo.n_pages;
  // A ring holds a sequence's own window: pages whose K/V other sequences could share exist only
  // for the global layers then, so nothing is cached.
  kv_ = std::make_unique<KvPages>(pages, opt.page_size, opt.max_seqs, seq_ctx,
                                  opt.prefix_cache && ring_pages_ == 0);
  table_stride_ = (seq_ctx + opt.page_size - 1) / opt.page_size;

  const size_t slots = size_t(pages + 1) * opt.page_size;  // + the padding rows' page
  const size_t ring_slots = size_t(opt.max_seqs + 1) * ring_pages_ * opt.page_size;
  std::vector<size_t> at(c_.n_layers + 1, 0);  // byte offset of layer l's K, then its V
  for (int l = 0; l < c_.n_layers; ++l)
    at[l + 1] = at[l] + (ring_pages_ && c_.is_swa(l) ? ring_slots : slots) * row_bytes;
  pool_ = cuda::DeviceBuffer(at[c_.n_layers], "KV pool (pass a smaller --kv-size)");
  std::vector<void*> k, v;
  for (int l = 0; l < c_.n_layers; ++l) {
    k.push_back(static_cast<char*>(pool_.get()) + at[l]);
    v.push_back(static_cast<char*>(pool_.get()) + (at[l] + at[l + 1]) / 2);
  }
  pw_ = cuda::prefill_view(c_, dw_, seq_ctx, opt.kv_half, k, v);
  pw_.token_embd = cuda::DevMat{};  // step() embeds from its own staging
  // one-row steps: row 1 of x is the residual's 2nd buffer
  if (f16_weights) {
    for (int l = 0; l < c_.n_layers; ++l) pw_.layers[l].dense = dense_.layers[l];
    pw_.dense_output = dense_.output;
    ws_.reserve_dense(c_, std::max(cap, 2), cap);
  } else {
    ws_.reserve(c_, std::max(cap, 2), cap);
  }

  const size_t tables = size_t(opt.max_seqs + 1) * table_stride_;
  mask_words_ = (c_.vocab_size + 31) / 32;
  masks_pinned_ = cuda::PinnedBuffer(sizeof(uint32_t) * opt.max_seqs * mask_words_, "token masks");
  masks_host_ = static_cast<uint32_t*>(masks_pinned_.get());
  cuda::Carver sizer;
  auto carve = [&](cuda::Carver& cv) {
    d_st_ = cv.take<int>(staged_ints(cap));
    d_tables_ = cv.take<int>(tables);
    if (ring_pages_) d_ring_tables_ = cv.take<int>(tables);
    d_xo_ = cv.take<float>(size_t(cap) * c_.dim);
    d_masks_ = cv.take<uint32_t>(size_t(opt.max_seqs) * mask_words_);
    // penalty windows: one per sampled row, at most one row per sequence
    d_hist_ = cv.take<int>(size_t(std::min(cap, opt.max_seqs)) * seq_ctx);
    d_sample_rows_ = cv.take<cuda::SampleRow>(size_t(std::min(cap, opt.max_seqs)));
    d_sample_keys_ =
        cv.take<uint32_t>(cuda::sample_scratch_words(c_.vocab_size, std::min(cap, opt.max_seqs)));
    d_partials_ =
        cv.take<float>(size_t(cap) * c_.n_heads * cuda::kAttnPagedSplits * (c_.head_dim + 2));
    d_counters_ = cv.take<int>(size_t(cap) * c_.n_kv_heads);
    d_prefix_ = cv.take<float>(size_t(std::min(cap, kCascadeMaxRows)) * c_.n_heads *
                               cuda::kAttnSharedSplits * (c_.head_dim + 2));
    d_prefix_counters_ = cv.take<int>(size_t(std::min(cap, kCascadeMaxRows)) * c_.n_heads);
    attn1_.partials = cv.take<float>(size_t(c_.n_heads) * cuda::attn_splits(seq_ctx, c_.head_dim) *
                                     (c_.head_dim + 2));
    attn1_.counters = cv.take<int>(c_.n_heads);
    d_part_v_ = cv.take<float>(cuda::kGemvMaxBlocks);
    d_part_i_ = cv.take<int>(cuda::kGemvMaxBlocks);
  };
  carve(sizer);
  dev_ = cuda::DeviceBuffer(sizer.used(), "multi-sequence step buffers");
  cuda::Carver placer(static_cast<char*>(dev_.get()));
  carve(placer);
  CUDA_CHECK(cudaMemset(d_counters_, 0, sizeof(int) * size_t(cap) * c_.n_kv_heads));
  CUDA_CHECK(cudaMemset(d_prefix_counters_, 0,
                        sizeof(int) * size_t(std::min(cap, kCascadeMaxRows)) * c_.n_heads));
  CUDA_CHECK(cudaMemset(attn1_.counters, 0, sizeof(int) * c_.n_heads));
  auto carve_host = [&](cuda::Carver& cv) {
    st_ = cv.take<int>(staged_ints(cap));
    out_host_ = cv.take<int>(cap);
    tables_host_ = cv.take<int>(tables);
    out1_ = cv.take<int>(2);
    sample_rows_host_ = cv.take<cuda::SampleRow>(size_t(std::min(cap, opt.max_seqs)));
  };
  cuda::Carver host_sizer;
  carve_host(host_sizer);
  host_ = cuda::PinnedBuffer(host_sizer.used(), "step staging");
  cuda::Carver host_placer(static_cast<char*>(host_.get()));
  carve_host(host_placer);
  if (ring_pages_) {
    // Fixed: sequence s's ring pages, repeated along the table, so page index t / page_size of
    // position t lands on ring page (t / page_size) % ring_pages. The padding sequence (row
    // max_seqs) has the ring past the sequences'.
    for (int s = 0; s <= opt.max_seqs; ++s)
      for (int i = 0; i < table_stride_; ++i)
        tables_host_[size_t(s) * table_stride_ + i] = s * ring_pages_ + i % ring_pages_;
    CUDA_CHECK(
        cudaMemcpy(d_ring_tables_, tables_host_, sizeof(int) * tables, cudaMemcpyHostToDevice));
  }
  // The padding "sequence" (row max_seqs) owns the page past the pool.
  std::fill(tables_host_, tables_host_ + tables, 0);
  tables_host_[size_t(opt.max_seqs) * table_stride_] = pages;
  CUDA_CHECK(cudaMemcpy(d_tables_, tables_host_, sizeof(int) * tables, cudaMemcpyHostToDevice));
  uploaded_.assign(opt.max_seqs, 0);
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  use_graph_ = co.use_graph;
  pdl_ = co.pdl;
  split_k_ = co.split_k;
  speculate_ = co.speculate;
  span_row_keys_ = co.span_row_keys;
  cascade_rows_ = co.cascade_rows, cascade_keys_ = co.cascade_keys;
  for (cudaEvent_t& e : done_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  if (f16_weights)
    pw_.dense_rows =
        opt.dense_rows > 0 ? opt.dense_rows : cuda::measure_dense_rows(pw_, ws_, cap, kernels());
}

CudaBatchBackend::~CudaBatchBackend() {
  if (stream_) cudaStreamSynchronize(stream_);
  for (auto& [k, g] : graphs_)
    if (g.exec) cudaGraphExecDestroy(g.exec);
  for (cudaEvent_t e : done_)
    if (e) cudaEventDestroy(e);
  if (stream_) cudaStreamDestroy(stream_);
}

// A 1 GiB device-to-device cudaMemcpy, best of 5 after a warm-up, counting read + write bytes.
double CudaBatchBackend::copy_bandwidth_gbs() {
  if (copy_gbs_ > 0) return copy_gbs_;
  const size_t n = size_t{1} << 30;
  cuda::DeviceBuffer a(n, "bandwidth probe"), b(n, "bandwidth probe");
  CUDA_CHECK(cudaMemset(a.get(), 1, n));
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  float best = 1e30f;
  for (int i = 0; i < 6; ++i) {
    CUDA_CHECK(cudaEventRecord(e0, stream_));
    CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), n, cudaMemcpyDeviceToDevice, stream_));
    CUDA_CHECK(cudaEventRecord(e1, stream_));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (i > 0 && ms < best) best = ms;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  copy_gbs_ = 2.0 * n / (best * 1e-3) / 1e9;
  return copy_gbs_;
}

std::string CudaBatchBackend::device_name() const {
  int dev = 0;
  cudaDeviceProp prop;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess)
    return "cuda";
  return prop.name;
}

// Rings hold the last ring rows of a sequence: going back keeps every window it needs as long as
// the step that follows reads nothing the ring has overwritten (kv_pages.h's sliding_ring_back).
void CudaBatchBackend::rollback(int seq, int pos) {
  spec_.on = false;
  const int back = kv_->position(seq) - pos;
  // One less when steps are speculated: a dropped one wrote the ring row one past the position.
  const int64_t most =
      sliding_ring_back(kv_ring_rows(), c_.sliding_window) - (speculating() ? 1 : 0);
  if (ring_pages_ && back > most)
    fail("rollback of sequence ", seq, " by ", back, " positions is beyond the sliding-window ",
         "layers' KV rings (at most ", most,
         "); allow more with a larger max step (--max-step-tokens)");
  kv_->truncate(seq, pos);
}

bool CudaBatchBackend::stage_tables(int seq) {
  const std::span<const int> bt = kv_->block_table(seq);
  int* row = tables_host_ + size_t(seq) * table_stride_;
  int from = 0;
  while (from < uploaded_[seq] && from < (int)bt.size() && row[from] == bt[from]) ++from;
  if (from == (int)bt.size()) return false;
  std::copy(bt.begin() + from, bt.end(), row + from);
  uploaded_[seq] = (int)bt.size();
  return true;
}

int CudaBatchBackend::fork_sequence(int seq) {
  spec_.on = false;
  const int f = kv_->fork(seq);
  // Sliding-window layers keep their rows in the sequence's ring: the fork takes a copy.
  const int rows = ring_pages_ * kv_->page_size();
  if (rows > 0)
    for (int l = 0; l < c_.n_layers; ++l)
      if (c_.is_swa(l)) copy_rows(l, seq * rows, f * rows, rows);
  return f;
}

int CudaBatchBackend::stage_table(int* fields, int seq) const {
  const std::span<const int> bt = kv_->block_table(seq);
  std::copy(bt.begin(), bt.end(), fields + kStaged);
  return kStaged + int(bt.size());
}

void CudaBatchBackend::stage_padding(int from, int nb) {
  const int pad_slot = kv_->pages_total() * kv_->page_size();
  for (int r = from; r < nb; ++r) {
    st(kTok, nb)[r] = 0, st(kPos, nb)[r] = 0, st(kSlot, nb)[r] = pad_slot;
    st(kSeq, nb)[r] = max_seqs(), st(kRingSlot, nb)[r] = ring_slot(max_seqs(), 0);
    st(kFirstPos, nb)[r] = 0;
  }
}

void CudaBatchBackend::stage_group(int nb, int g, int table_row, int keys, int m0, int count) {
  int* gr = st_ + cgroups_at(nb) + g * cuda::kSharedGroupInts;
  gr[0] = table_row, gr[1] = keys, gr[2] = m0, gr[3] = count;
  int* cb = st_ + cascade_at(nb);
  const int G = c_.n_heads / c_.n_kv_heads;
  for (int q = 0; q * cuda::kSharedQueryRows < count * G; ++q) cb[1 + cb[0]++] = g << 16 | q;
}

// A group's shared keys are the pages all its entries hold, up to the first position any of them
// writes now (so earlier steps wrote them), in whole tiles.
std::vector<CudaBatchBackend::CascadeGroup> CudaBatchBackend::cascade_groups(
    std::span<const SeqStep> batch, const std::vector<int>& p0s,
    const std::vector<char>& paged) const {
  std::vector<std::pair<int, int>> firsts;  // (first page, entry)
  for (size_t i = 0; i < batch.size(); ++i)
    if (paged[i] && p0s[i] >= cuda::kSharedTile)
      firsts.emplace_back(kv_->block_table(batch[i].seq)[0], (int)i);
  std::sort(firsts.begin(), firsts.end());
  const int ps = kv_->page_size();
  std::vector<CascadeGroup> groups;
  for (size_t a = 0, b; a < firsts.size() && groups.size() < kCascadeGroups; a = b) {
    for (b = a + 1; b < firsts.size() && firsts[b].first == firsts[a].first;) ++b;
    CascadeGroup g;
    g.keys = INT_MAX;
    for (size_t e = a; e < b; ++e) {
      g.keys = std::min(g.keys, p0s[firsts[e].second]);
      g.rows += (int)batch[firsts[e].second].tokens.size();
    }
    if (g.rows < cascade_rows_) continue;  // (most steps: no page in common)
    const std::span<const int> t0 = kv_->block_table(batch[firsts[a].second].seq);
    for (size_t e = a + 1; e < b; ++e) {
      const std::span<const int> t = kv_->block_table(batch[firsts[e].second].seq);
      int j = 1;  // page 0 is the group's
      while (j * ps < g.keys && t[j] == t0[j]) ++j;
      g.keys = std::min(g.keys, j * ps);
    }
    g.keys -= g.keys % cuda::kSharedTile;
    if (g.keys < std::max(cascade_keys_, cuda::kSharedTile)) continue;
    g.table_row = batch[firsts[a].second].seq;
    for (size_t e = a; e < b; ++e) g.entries.push_back(firsts[e].second);
    groups.push_back(std::move(g));
  }
  return groups;
}

int CudaBatchBackend::stage_cascade(int nb, std::span<const SeqStep> batch,
                                    const std::vector<int>& p0s, const std::vector<int>& row0s,
                                    const std::vector<char>& paged, std::vector<int>& skip) {
  const std::vector<CascadeGroup> groups = cascade_groups(batch, p0s, paged);
  if (groups.empty()) return 0;
  int* cm = st_ + cmembers_at(nb);
  st_[cascade_at(nb)] = 0;
  int n_members = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    stage_group(nb, (int)g, groups[g].table_row, groups[g].keys, n_members, groups[g].rows);
    for (int i : groups[g].entries) {
      skip[i] = groups[g].keys;
      for (int j = 0; j < (int)batch[i].tokens.size(); ++j) cm[n_members++] = row0s[i] + j;
    }
    cascaded_ += groups[g].rows;
  }
  int* cs = st_ + cskip_at(nb);
  std::fill(cs, cs + nb, 0);
  for (size_t i = 0; i < batch.size(); ++i)
    std::fill_n(cs + row0s[i], batch[i].tokens.size(), skip[i]);
  return (int)groups.size();
}

// Each kind of step once, on padding rows only: their K/V rows go to the padding page and their
// attention reads the scratch sequence's table row (that page, then page 0 of the pool: read, never
// written); a cascade step loads the shared pass's kernel (CUDA loads a kernel at its first
// launch: tens of ms, which the first requests sharing a prefix would otherwise wait for). Many-row
// steps run at every bucket with one output row and with all rows out (the GEMM kernels and the
// fp16 plans go by row count; the longest context's attention splits for the latter), eagerly:
// their graphs are keyed by the splits a step's contexts need, captured when a shape first comes.
// The one-row graphs are captured here.
void CudaBatchBackend::warm_up() {
  spec_.on = false;  // a pending one runs first (stream order); stage() waits for it
  // chunk: the rows as one prompt chunk (of the scratch sequence); cascade: the rows at position
  // kSharedTile, one group sharing the scratch sequence's first tile.
  auto stage = [&](int nb, int mb, bool chunk, bool cascade = false) {
    // The staging block is pinned host memory: the last step's copy must have read it.
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    stage_padding(0, nb);
    for (int r = 0; r < mb; ++r) st(kOutRow, nb)[r] = r, st(kMaskIdx, nb)[r] = -1;
    for (int r = 0; r < nb; ++r) st(kAttnRow, nb)[r] = chunk ? -1 : r;
    int ints = kStaged * nb;
    if (nb == 1) {
      st(kConsec, nb)[0] = 0;
      st_[kStaged] = tables_host_[size_t(max_seqs()) * table_stride_];  // the padding page
      ints = kStaged + 1;
    } else if (chunk) {
      const int q = cuda::attention_prefill_query_tile(c_.head_dim);
      int* t = st_ + tiles_at(nb);
      t[0] = (nb + q - 1) / q;
      for (int i = 0; i < t[0]; ++i) t[1 + i] = i;  // span 0
      int* span = st_ + spans_at(nb);
      span[0] = 0, span[1] = nb, span[2] = max_seqs(), span[3] = 0, span[4] = 0;
      ints = spans_at(nb) + cuda::kPrefillSpanInts;
    } else if (cascade) {
      const int t = cuda::kSharedTile;
      for (int r = 0; r < nb; ++r) st(kPos, nb)[r] = st(kFirstPos, nb)[r] = t;
      st_[cascade_at(nb)] = 0;
      stage_group(nb, 0, max_seqs(), t, 0, nb);
      for (int r = 0; r < nb; ++r) st_[cmembers_at(nb) + r] = r, st_[cskip_at(nb) + r] = t;
      ints = cskip_at(nb) + nb;
    }
    CUDA_CHECK(cudaMemcpyAsync(d_st_, st_, sizeof(int) * ints, cudaMemcpyHostToDevice, stream_));
  };
  const int cap = bucket(max_step_);
  for (int nb : kBuckets) {
    if (nb == 1 || nb > cap) continue;
    const int wide =
        cuda::attn_paged_splits(kv_->seq_ctx() - 1, nb * c_.n_kv_heads, cuda::sm_count());
    stage(nb, 1, false);
    forward(nb, 1, Shape{1}, out_host_);
    stage(nb, nb, false);
    forward(nb, nb, Shape{wide, nb == 2}, out_host_);  // masked once: its kernel
  }
  // Cascade attention's shared pass: two rows at position kSharedTile over the scratch sequence's
  // table row (its page, then pool page 0 for the rest: read, never written).
  if (cap >= 2 && kv_->seq_ctx() > 2 * cuda::kSharedTile) {
    stage(2, 1, false, true);
    forward(2, 1, Shape{1, false, false, true}, out_host_);
  }
  // A prompt's chunk (attention_prefill): positions up to its rows must be in a table row.
  const int chunk = bucket(kChunkAttnRows);
  if (chunk <= cap && chunk <= kv_->seq_ctx()) {
    stage(chunk, 1, true);
    forward(chunk, 1, Shape{0, false, true}, out_host_);
  }
  stage(1, 1, false);
  forward(1, 1, Shape{0, true}, out1_);  // masked: the logits, then their argmax
  for (int par : {0, 1}) {
    stage(1, 1, false);
    launch(1, 1, Shape{}, par);
  }
  if (c_.vocab_size <= cuda::kSampleMaxVocab) {
    cuda::sample(ws_.logits, c_.vocab_size, SamplingParams{}, 0.5f, nullptr, 0, out1_,
                 d_sample_keys_, kernels());
  }
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBatchBackend::copy_rows(int l, int src, int dst, int n) {
  const size_t row = size_t(c_.kv_dim()) * (pw_.kv_half ? 2 : 4);
  for (void* base : {pw_.layers[l].k_cache, pw_.layers[l].v_cache}) {
    char* b = static_cast<char*>(base);
    CUDA_CHECK(
        cudaMemcpyAsync(b + dst * row, b + src * row, n * row, cudaMemcpyDeviceToDevice, stream_));
  }
}

void CudaBatchBackend::copy_pool_rows(int src, int dst, int n) {
  const size_t row = size_t(c_.kv_dim()) * (pw_.kv_half ? 2 : 4);
  auto pooled = [&](int l) { return !(ring_pages_ && c_.is_swa(l)); };
  for (int l = 0, e; l < c_.n_layers; l = e) {
    e = l + 1;
    if (!pooled(l)) continue;
    while (e < c_.n_layers && pooled(e)) ++e;
    char* k = static_cast<char*>(pw_.layers[l].k_cache);
    const size_t pitch = static_cast<char*>(pw_.layers[l].v_cache) - k;
    CUDA_CHECK(cudaMemcpy2DAsync(k + dst * row, pitch, k + src * row, pitch, n * row,
                                 2 * size_t(e - l), cudaMemcpyDeviceToDevice, stream_));
  }
}

void CudaBatchBackend::forward(int nb, int mb, const Shape& sh, int* out) {
  const cuda::Launch k = kernels();
  const int splits = sh.splits;
  const bool masked = sh.masked;
  cuda::StepRows rows;
  if (sh.cascade) {
    cuda::SharedPrefix& sp = rows.shared;
    sp.blocks = d_st_ + cascade_at(nb), sp.groups = d_st_ + cgroups_at(nb);
    sp.members = d_st_ + cmembers_at(nb), sp.row_skip = d_st_ + cskip_at(nb);
    sp.prefix = d_prefix_, sp.counters = d_prefix_counters_, sp.max_blocks = cblock_cap(nb);
  }
  if (sh.chunks) {
    rows.tiles = d_st_ + tiles_at(nb), rows.spans = d_st_ + spans_at(nb);
    rows.max_tiles = tile_cap(nb);
    rows.consecutive = rows.spans;  // each span says (its fourth int)
    rows.attn_rows = d_st(kAttnRow, nb), rows.attn_n = attn_cap(nb);
  }
  if (nb == 1) rows.consecutive = d_st(kConsec, nb);
  rows.pos = d_st(kPos, nb), rows.slot = d_st(kSlot, nb), rows.seq = d_st(kSeq, nb);
  rows.tables = d_tables_, rows.table_stride = table_stride_, rows.page_size = kv_->page_size();
  rows.attn_partials = d_partials_, rows.attn_counters = d_counters_, rows.attn_splits = splits;
  if (ring_pages_) rows.ring_slot = d_st(kRingSlot, nb), rows.ring_tables = d_ring_tables_;
  rows.first_new = d_st(kFirstPos, nb);
  const int V = c_.vocab_size;
  // Structured output: rows with a mask have the others' logits set to -inf before the argmax.
  auto mask_and_argmax = [&] {
    if (masked)
      cuda::mask_logits(ws_.logits, V, V, mb, d_st(kMaskIdx, nb), d_masks_, mask_words_, k);
    cuda::argmax_rows(ws_.logits, V, V, mb, out, k);
  };
  cuda::embed(dw_.token_embd, d_st(kTok, nb), nb, ws_.x, c_.dim, k, c_.embed_scale);
  if (nb == 1) {
    // One row: the GEMVs and the split decode attention over the table staged with the step,
    // built for latency and faster for a lone sequence than the GEMM path.
    rows.row_table = d_st_ + kStaged, rows.decode_scratch = attn1_, rows.seq_ctx = kv_->seq_ctx();
    const float* x = cuda::step_forward(pw_, ws_, 1, 0, /*logit_rows=*/0, k, &rows);
    const float eps = c_.norm_eps;
    if (masked) {  // the logits first, masked, then their argmax
      cuda::gemv(dw_.output, x, dw_.output_norm, eps, ws_.logits, /*accumulate=*/false, k);
      return mask_and_argmax();
    }
    // lm_head with argmax stage 1 fused, then stage 2 (the decode step's pair).
    const int parts =
        cuda::gemv_argmax(dw_.output, x, dw_.output_norm, eps, ws_.logits, d_part_v_, d_part_i_, k);
    // Hand-off: the staging becomes that of this sequence's next one-row step (speculate).
    // (The ring slot too: unused without rings.)
    const cuda::StepHandoff next{d_st_ + kTok, d_st_,
                                 1u << kPos | 1u << kSlot | 1u << kRingSlot | 1u << kFirstPos};
    cuda::argmax_final(d_part_v_, d_part_i_, parts, out, k, next);
    return;
  }
  cuda::step_forward(pw_, ws_, nb, 0, /*logit_rows=*/0, k, &rows);
  cuda::gather_rows(ws_.x, c_.dim, d_st(kOutRow, nb), mb, c_.dim, d_xo_, k);
  if (mb == 1) {  // one output row (a lone prompt's last token): the decode step's lm_head GEMV
    cuda::gemv(dw_.output, d_xo_, dw_.output_norm, c_.norm_eps, ws_.logits, /*accumulate=*/false,
               k);
    return mask_and_argmax();
  }
  if (pw_.dense() && mb >= pw_.dense_rows && c_.vocab_size % 4 == 0) {
    cuda::act_to_f16(d_xo_, c_.dim, mb, c_.dim, dw_.output_norm, c_.norm_eps, ws_.xd, ws_.ldd(), k,
                     cuda::F16Order::kRowMajor);
    ws_.dense().run(pw_.dense_output, c_.vocab_size, c_.dim, ws_.xd, ws_.ldd(), mb,
                    {ws_.logits, c_.vocab_size, false, false}, k);
    return mask_and_argmax();
  }
  cuda::GemmArgs h;
  h.t = mb, h.w0 = dw_.output, h.x = d_xo_, h.ldx = c_.dim, h.norm_w = dw_.output_norm;
  h.eps = c_.norm_eps;
  cuda::GemmOut o;
  o.y = ws_.logits, o.ldy = c_.vocab_size;
  cuda::gemm(h, cuda::GemmEpilogue::Store, o, k);
  mask_and_argmax();
}

bool CudaBatchBackend::speculable(std::span<const SeqStep> batch, bool adopting) const {
  if (!speculating() || batch.size() != 1) return false;
  const SeqStep& s = batch[0];
  // The next position in the same page: its pool slot and ring slot are this step's + 1.
  return s.tokens.size() == 1 && s.sample && (adopting || !s.last) && s.params.greedy() &&
         !s.params.has_penalties() && s.logits == 0 && s.allowed.empty() &&
         kv_->position(s.seq) < kv_->seq_ctx() && kv_->pages_needed(s.seq, 1) == 0 &&
         kv_->position(s.seq) % kv_->page_size() != 0;
}

void CudaBatchBackend::speculate(int seq, int par) {
  // Its staging is the previous step's, advanced on the device by that step's hand-off (the id
  // as the token; position, slots and first position + 1: the same page, see speculable).
  const int q = par ^ 1, p = kv_->position(seq);
  launch(1, 1, Shape{}, q);
  CUDA_CHECK(cudaEventRecord(done_[q], stream_));
  par_ = q;
  spec_.on = true, spec_.seq = seq, spec_.pos = p, spec_.par = q;
}

std::vector<SeqResult> CudaBatchBackend::adopt(const SeqStep& s) {
  std::vector<PageCopy> copies;
  kv_->grow(s.seq, s.tokens, copies);  // the position only: the page was there, and owned
  if (!copies.empty()) fail("internal: an adopted step's page needed a copy");
  const int q = spec_.par;
  spec_.on = false;
  ++adopted_;
  const bool next = speculable(std::span<const SeqStep>(&s, 1));
  if (next) speculate(s.seq, q);  // the one after, fed this one's id
  CUDA_CHECK(cudaEventSynchronize(done_[q]));
  kv_->publish(s.seq);
  std::vector<SeqResult> res(1);
  res[0].token = out1_[q];
  spec_.token = res[0].token;
  return res;
}

void CudaBatchBackend::launch(int nb, int mb, const Shape& sh, int par) {
  int* out = ids_out(nb, par);
  if (!use_graph_) return forward(nb, mb, sh, out);
  Graph& g = graphs_[{nb, mb, sh.splits, sh.masked, par, sh.chunks, sh.cascade}];
  if (!g.exec) {
    // Recording a graph stalls the step that does it by 5-10 ms (served, H200), and every
    // running sequence with it: a many-row shape runs launch by launch until its
    // kGraphAfterRuns-th step, so the shapes a workload brings rarely never pay it. Those eager
    // runs also let its dense GEMMs pick their kernels by timing (dense_gemm.h: not possible while
    // capturing). One-row steps have no dense GEMM, and their hand-off advances the staging: they
    // are recorded at once.
    if (nb > 1 && ++g.eager_runs < kGraphAfterRuns) return forward(nb, mb, sh, out);
    cudaGraph_t graph;
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    forward(nb, mb, sh, out);
    CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&g.exec, graph, 0));
    CUDA_CHECK(cudaGraphDestroy(graph));
    ++captures_;
  }
  CUDA_CHECK(cudaGraphLaunch(g.exec, stream_));
}

std::vector<SeqResult> CudaBatchBackend::step(std::span<const SeqStep> batch) {
  check_step(batch);
  if (spec_.on) {
    if (batch.size() == 1 && batch[0].seq == spec_.seq &&
        kv_->position(batch[0].seq) == spec_.pos && batch[0].tokens.size() == 1 &&
        batch[0].tokens[0] == spec_.token && speculable(batch, /*adopting=*/true))
      return adopt(batch[0]);
    // Dropped: it runs before anything launched now, and wrote nothing this step reads.
    spec_.on = false;
  }
  int rows = 0;
  for (const SeqStep& s : batch) rows += (int)s.tokens.size();
  const int nb = bucket(rows);
  int n = 0, m = 0, n_masks = 0;
  int lo = INT_MAX, hi = 0;  // sequences whose table rows changed: [lo, hi)
  // out rows of each entry: [first, first + count) of the gathered rows
  std::vector<std::pair<int, int>> outs(batch.size());
  std::vector<PageCopy> copies;
  int *toks = st(kTok, nb), *pos = st(kPos, nb), *slot = st(kSlot, nb), *seq = st(kSeq, nb);
  int *out_row = st(kOutRow, nb), *ring = st(kRingSlot, nb), *first_pos = st(kFirstPos, nb);
  int *mask_idx = st(kMaskIdx, nb), *attn_row = st(kAttnRow, nb);
  // Each entry's first position and first row, and whether its rows take attention_paged.
  std::vector<int> p0s(batch.size()), row0s(batch.size());
  std::vector<char> paged(batch.size(), 1);
  int chunk_rows = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    p0s[i] = kv_->position(batch[i].seq);
    if (batch[i].tokens.size() >= 2) chunk_rows += (int)batch[i].tokens.size();
  }
  // Rows sharing a prefix (cascade attention) read the shared keys once for all.
  const bool cascading = nb > 1 && nb <= kCascadeMaxRows;
  std::vector<int> skip(batch.size(), 0);
  if (cascading && chunk_rows > 0)
    for (const CascadeGroup& g : cascade_groups(batch, p0s, paged))
      for (int i : g.entries) skip[i] = g.keys;
  // Whether the chunks take attention_prefill: the keys their rows read (each row its position + 1,
  // past the keys it would share through cascade attention) beside one-row entries, or their rows
  // alone.
  int64_t row_keys = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const int64_t len = (int64_t)batch[i].tokens.size(), p0 = p0s[i] - skip[i];
    if (len >= 2) row_keys += len * p0 + len * (len + 1) / 2;
  }
  const bool chunks =
      nb > 1 && chunk_rows > 0 &&
      (row_keys >= span_row_keys_ || (chunk_rows == rows && chunk_rows >= kChunkAttnRows));
  // A lone sequence's attention finds a row from its first page alone when its pages are
  // consecutive (StepRows::consecutive): where they are not (a prefix hit's cached pages, then its
  // own), they move to a free run of the pool first.
  const bool lone = batch.size() == 1 && (nb == 1 || chunks);
  if (lone) kv_->gather(batch[0].seq, rows, copies);
  // Prompt chunks (attention_prefill): each one's span and query tiles, the tiles longest first.
  const int q_tile = cuda::attention_prefill_query_tile(c_.head_dim);
  int n_spans = 0, n_attn = 0;
  std::vector<std::pair<int, int>> tiles;  // (keys the tile's last query sees, its entry)
  int* span = st_ + spans_at(nb);
  for (size_t i = 0; i < batch.size(); ++i) {
    const SeqStep& s = batch[i];
    const int p0 = p0s[i], len = (int)s.tokens.size();
    row0s[i] = n;
    kv_->grow(s.seq, s.tokens, copies);
    if (stage_tables(s.seq)) lo = std::min(lo, s.seq), hi = std::max(hi, s.seq + 1);
    if (chunks && len >= 2) {
      int* sp = span + n_spans * cuda::kPrefillSpanInts;
      sp[0] = p0, sp[1] = len, sp[2] = s.seq, sp[3] = kv_->consecutive(s.seq), sp[4] = n;
      for (int t = 0; t * q_tile < len; ++t)
        tiles.emplace_back(p0 + std::min(len, (t + 1) * q_tile), n_spans << 16 | t);
      ++n_spans;
      paged[i] = 0;
    } else {
      for (int j = 0; j < len; ++j) attn_row[n_attn++] = n + j;
    }
    const int first = s.logits == 2 ? n : n + len - 1;
    const int count = s.logits == 2 ? len : (s.sample || s.logits == 1 ? 1 : 0);
    outs[i] = {m, count};
    for (int j = 0; j < len; ++j, ++n) {
      toks[n] = s.tokens[j];
      pos[n] = p0 + j;
      slot[n] = kv_->slot(s.seq, p0 + j);
      seq[n] = s.seq;
      ring[n] = ring_slot(s.seq, p0 + j);
      first_pos[n] = p0;
    }
    const bool masked = !s.allowed.empty() && count > 0;
    if (masked)
      std::copy_n(s.allowed.begin(), mask_words_, masks_host_ + size_t(n_masks) * mask_words_);
    for (int j = 0; j < count; ++j) {
      out_row[m] = first + j;
      mask_idx[m++] = masked && j == count - 1 ? n_masks : -1;  // the last token's logits
    }
    n_masks += masked ? 1 : 0;
  }
  const int mb = bucket(std::max(m, 1));
  // The cascade groups of the step's attention_paged entries, over their tables after grow (a
  // shared page copied on write is no longer shared).
  std::fill(skip.begin(), skip.end(), 0);
  const int n_groups =
      cascading && n_attn >= cascade_rows_ ? stage_cascade(nb, batch, p0s, row0s, paged, skip) : 0;
  // attention_paged's splits for its rows (every row of the bucket without chunks; none in one-row
  // steps: their attention picks its own on the device, so their graph serves every context), by
  // the most keys a row reads past its shared prefix
  int attn_max_pos = 0;
  for (size_t i = 0; i < batch.size(); ++i)
    if (paged[i])
      attn_max_pos = std::max(attn_max_pos, p0s[i] + (int)batch[i].tokens.size() - 1 - skip[i]);
  const int splits =
      nb == 1 || n_attn == 0
          ? 0
          : cuda::attn_paged_splits(attn_max_pos, (chunks ? n_attn : nb) * c_.n_kv_heads,
                                    cuda::sm_count());
  for (int r = n_attn; r < nb; ++r) attn_row[r] = -1;
  if (!tiles.empty()) {
    std::sort(tiles.begin(), tiles.end(),
              [](const auto& a, const auto& b) { return a.first > b.first; });
    int* t = st_ + tiles_at(nb);
    t[0] = (int)tiles.size();
    for (size_t i = 0; i < tiles.size(); ++i) t[1 + i] = tiles[i].second;
  }
  stage_padding(n, nb);
  for (int r = m; r < mb; ++r) out_row[r] = 0, mask_idx[r] = -1;
  // Pages moved (gather) or copied on write before the step writes into them (kv_pages.h), runs
  // of consecutive pages in one copy.
  const int ps = kv_->page_size();
  for (size_t i = 0, e; i < copies.size(); i = e) {
    for (e = i + 1; e < copies.size() && copies[e].src == copies[e - 1].src + 1 &&
                    copies[e].dst == copies[e - 1].dst + 1;)
      ++e;
    copy_pool_rows(copies[i].src * ps, copies[i].dst * ps, int(e - i) * ps);
  }
  // The changed table rows in one copy (a step crossing pages in many sequences would otherwise
  // pay one copy each); the rows between them are copied unchanged.
  if (lo < hi)
    CUDA_CHECK(cudaMemcpyAsync(
        d_tables_ + size_t(lo) * table_stride_, tables_host_ + size_t(lo) * table_stride_,
        sizeof(int) * size_t(hi - lo) * table_stride_, cudaMemcpyHostToDevice, stream_));
  if (nb == 1) st(kConsec, nb)[0] = kv_->consecutive(batch[0].seq);
  const int staged = nb == 1        ? stage_table(st_, batch[0].seq)
                     : n_groups > 0 ? cskip_at(nb) + nb
                     : n_spans > 0  ? spans_at(nb) + n_spans * cuda::kPrefillSpanInts
                                    : kStaged * nb;
  CUDA_CHECK(cudaMemcpyAsync(d_st_, st_, sizeof(int) * staged, cudaMemcpyHostToDevice, stream_));
  if (n_masks > 0)
    CUDA_CHECK(cudaMemcpyAsync(d_masks_, masks_host_, sizeof(uint32_t) * n_masks * mask_words_,
                               cudaMemcpyHostToDevice, stream_));
  const bool masked = n_masks > 0;

  const int par = nb == 1 ? (par_ ^= 1) : 0;
  int* out = ids_out(nb, par);
  launch(nb, mb, Shape{splits, masked, chunks, n_groups > 0}, par);

  // Rows that sample with more than argmax: the GPU sampler, one block per row in one launch
  // (the rows and their penalty windows staged in one copy each); a row it cannot take (a top-k
  // past kSampleMaxCandidates: -1) samples on the host.
  const int V = c_.vocab_size;
  std::vector<int> hist_off(batch.size(), 0);
  size_t hist_n = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const SeqStep& s = batch[i];
    if (!s.sample || (s.params.greedy() && !s.params.has_penalties())) continue;
    hist_off[i] = (int)hist_n;
    hist_n += cpu::penalty_window(s.history, s.params).size();
  }
  if (hist_n > 0) {
    if (hist_pinned_.size() < hist_n * sizeof(int))
      hist_pinned_ = cuda::PinnedBuffer(std::max(hist_n * sizeof(int), size_t{4096}), "history");
    int* hh = static_cast<int*>(hist_pinned_.get());
    for (size_t i = 0; i < batch.size(); ++i) {
      const SeqStep& s = batch[i];
      if (!s.sample || (s.params.greedy() && !s.params.has_penalties())) continue;
      const std::span<const int> w = cpu::penalty_window(s.history, s.params);
      std::copy(w.begin(), w.end(), hh + hist_off[i]);
    }
    CUDA_CHECK(cudaMemcpyAsync(d_hist_, hh, sizeof(int) * hist_n, cudaMemcpyHostToDevice, stream_));
  }
  const bool gpu_sampler = V <= cuda::kSampleMaxVocab;
  if (gpu_sampler) {
    int n_sampled = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      const SeqStep& s = batch[i];
      if (!s.sample || (s.params.greedy() && !s.params.has_penalties())) continue;
      cuda::SampleRow& row = sample_rows_host_[n_sampled++];
      row.p = s.params, row.u = s.u, row.logits_row = outs[i].first + outs[i].second - 1;
      row.hist_off = hist_off[i];
      row.n_hist = (int)cpu::penalty_window(s.history, s.params).size();
      row.out = row.logits_row;
    }
    if (n_sampled > 0) {
      CUDA_CHECK(cudaMemcpyAsync(d_sample_rows_, sample_rows_host_,
                                 sizeof(cuda::SampleRow) * size_t(n_sampled),
                                 cudaMemcpyHostToDevice, stream_));
      cuda::sample_rows(ws_.logits, V, V, d_sample_rows_, n_sampled, d_hist_, out, d_sample_keys_,
                        kernels());
    }
  }
  // Logits asked for: one copy per entry into pinned memory, in the stream before the wait.
  size_t logit_rows = 0;
  for (size_t i = 0; i < batch.size(); ++i)
    if (batch[i].logits > 0) logit_rows += size_t(outs[i].second);
  if (logits_pinned_.size() < logit_rows * V * sizeof(float))
    logits_pinned_ = cuda::PinnedBuffer(logit_rows * V * sizeof(float), "logits readback");
  float* const lh = static_cast<float*>(logits_pinned_.get());
  std::vector<size_t> logit_at(batch.size(), 0);
  for (size_t i = 0, at = 0; i < batch.size(); ++i) {
    if (batch[i].logits == 0) continue;
    logit_at[i] = at;
    const auto [first, count] = outs[i];
    CUDA_CHECK(cudaMemcpyAsync(lh + at, ws_.logits + size_t(first) * V,
                               sizeof(float) * size_t(count) * V, cudaMemcpyDeviceToHost, stream_));
    at += size_t(count) * V;
  }
  const bool next = nb == 1 && speculable(batch);
  if (next) {
    CUDA_CHECK(cudaEventRecord(done_[par], stream_));
    speculate(batch[0].seq, par);
    CUDA_CHECK(cudaEventSynchronize(done_[par]));  // the id is in out1_[par]
  } else {
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // the ids are in out
  }
  for (const SeqStep& s : batch) kv_->publish(s.seq);

  std::vector<SeqResult> res(batch.size());
  std::vector<float> row;
  for (size_t i = 0; i < batch.size(); ++i) {
    const SeqStep& s = batch[i];
    const auto [first, count] = outs[i];
    const bool plain = s.params.greedy() && !s.params.has_penalties();
    const int last = first + count - 1;
    if (s.logits > 0) res[i].logits.assign(lh + logit_at[i], lh + logit_at[i] + size_t(count) * V);
    if (!s.sample) continue;
    int tok = (plain || gpu_sampler) ? out[last] : -1;
    if (tok < 0) {  // the host sampler on this row's logits
      std::span<const float> l;
      if (s.logits > 0) {
        l = std::span<const float>(res[i].logits).last(V);
      } else {
        row.resize(V);
        CUDA_CHECK(cudaMemcpy(row.data(), ws_.logits + size_t(last) * V, sizeof(float) * V,
                              cudaMemcpyDeviceToHost));
        l = row;
      }
      tok = cpu::sample(l, s.params, s.u, s.history, scratch_);
    }
    res[i].token = tok;
  }
  if (next) spec_.token = res[0].token;
  return res;
}

}  // namespace

std::unique_ptr<BatchBackend> make_cuda_batch_backend_ex(const Model& m, const BatchOptions& opt,
                                                         const CudaOptions& copt) {
  if (!cuda_device_available())
    fail("the CUDA backend was asked for but no CUDA GPU is visible; use --backend cpu");
  return std::make_unique<CudaBatchBackend>(m, opt, copt);
}

std::unique_ptr<BatchBackend> make_cuda_batch_backend(const Model& m, const BatchOptions& opt) {
  return make_cuda_batch_backend_ex(m, opt, CudaOptions{});
}

}  // namespace smolrt
