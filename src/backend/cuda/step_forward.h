// The CUDA engine's forward pass over the rows of one step, layer-major: every row passes layer L
// before layer L+1. Per layer:
//   1. norm + QKV + finish (biases, QK norms, RoPE) + K/V written into the cache
//   2. attention: the split decode attention (a one-row step); attention_paged (rows of many
//      sequences) and/or attention_prefill (the prompt chunks a step lists as spans; without
//      StepRows, the rows as one chunk)
//   3. x += Wo att (post norm)
//   4. norm + gate/up + act(gate)*up
//   5. x += Wdown h (post norm)
// The matmuls run as GEMVs (a one-row step, built for latency), the quantized GEMM, or cuBLASLt on
// the fp16 weight copies (steps from dense_rows up); the norms, RoPE and KV write fuse into their
// epilogues where the architecture allows (qkv_fused). Then optionally RMSNorm(output_norm) +
// lm_head (the decode gemv, one launch per logits row) and argmax.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "backend/cuda/device_weights.h"
#include "cuda/attention_decode.h"
#include "cuda/attention_paged.h"
#include "cuda/dense_gemm.h"
#include "cuda/dev_mat.h"
#include "cuda/launch.h"
#include "model/model.h"
#include "quant/formats.h"

namespace smolrt::cuda {

// Device pointers a step reads: the engine's one weight image (cuda/dev_mat.h split layout). A
// layer's weights are a DevLayer (matrices in any format the GEMV and GEMM take, f32 norms, the
// architecture's optional vectors) plus where its KV cache lives and its fp16 dense copies.
struct StepLayerWeights : DevLayer {
  void* k_cache = nullptr;  // [n_ctx][kv_dim], fp16 if kv_half else fp32
  void* v_cache = nullptr;
  DenseLayer dense;
};

struct StepWeights {
  ModelConfig cfg;
  int n_ctx = 0;
  bool kv_half = true;
  // Embedding table (any type cuda::embed takes); q == nullptr: step_forward skips the
  // embedding and the caller has filled ws.x rows [0, n) itself.
  DevMat token_embd;
  const float* output_norm = nullptr;   // [dim]
  DevMat output;                        // lm_head (any type the decode gemv takes)
  const float* rope_factors = nullptr;  // [rope_dim / 2] llama3 frequency factors, or nullptr
  std::vector<StepLayerWeights> layers;
  // The dense path (layers[].dense set): fp16 [vocab][dim] lm_head, and the row count from which
  // a chunk's or step's GEMMs run on it (0: never; the engines set measure_dense_rows()).
  const uint16_t* dense_output = nullptr;
  int dense_rows = 0;
  bool dense() const { return dense_rows > 0; }
};

// Activation buffers for one chunk; allocated once, grown by reserve(), reused across calls.
class StepWorkspace {
 public:
  StepWorkspace() = default;
  ~StepWorkspace();
  StepWorkspace(const StepWorkspace&) = delete;
  StepWorkspace& operator=(const StepWorkspace&) = delete;

  // Ensures room for max_tokens tokens per chunk and logits for max_logit_rows of them.
  void reserve(const ModelConfig& c, int max_tokens, int max_logit_rows);
  int capacity() const { return cap_tokens_; }
  int logit_capacity() const { return cap_logits_; }
  // Also the dense path's buffers (xd, qkv, gu, hd) when dense.
  void reserve_dense(const ModelConfig& c, int max_tokens, int max_logit_rows);
  bool has_dense() const { return dense_ != nullptr; }
  DenseGemm& dense() { return *dense_; }
  // Bumped by every reallocation: anything that baked in the buffer addresses (a captured graph)
  // is stale once it changes. (A new buffer may land at an old address, so comparing pointers
  // does not tell.)
  unsigned long generation() const { return generation_; }

  float* x = nullptr;    // [cap][dim] residual stream
  float* q = nullptr;    // [cap][q_dim] roped queries
  float* att = nullptr;  // [cap][q_dim] attention output
  float* ffh = nullptr;  // [cap][hidden_dim] act(gate)*up
  // The unfused architecture path (qkv_fused false, post norms): raw K and
  // V [cap][kv_dim] and a projection before its post norm [cap][dim].
  float* k = nullptr;
  float* v = nullptr;
  float* tmp = nullptr;
  float* attn_scratch = nullptr;  // attention_prefill's key-split partials (wide heads)
  // fp16 GEMM inputs in fragment order (gemm.h), pad columns zero: xh for chunks of at least
  // kGemmF16MinTokens, hh (the down GEMM's input) from 33 tokens on:
  uint16_t* xh = nullptr;  // [cap][ldh()] normalized x or attention output
  uint16_t* hh = nullptr;  // [cap][ldh()] silu(gate)*up
  int ldh() const { return ldh_; }
  // The dense path: fp16 row-major GEMM inputs and outputs.
  uint16_t* xd = nullptr;  // [cap][ldd()] normalized x or attention output
  float* qkv = nullptr;    // [cap][q_dim + 2 kv_dim] the QKV product (q finished in place)
  uint16_t* gu = nullptr;  // [cap][2 hidden_dim] gate | up products
  uint16_t* hd = nullptr;  // [cap][ldd()] act(gate) * up
  int ldd() const { return ldd_; }
  float* logits = nullptr;  // [cap_logits][vocab]
  int* tokens = nullptr;    // [cap] token ids of the chunk
  int* argmax = nullptr;    // [cap_logits] argmax of each logits row

 private:
  void release();
  int cap_tokens_ = 0, cap_logits_ = 0;
  unsigned long generation_ = 0;
  int dim_ = 0, q_dim_ = 0, kv_dim_ = 0, heads_ = 0, hd_ = 0, hidden_ = 0, vocab_ = 0, ldh_ = 0;
  int ldd_ = 0;
  bool want_dense_ = false;
  std::unique_ptr<DenseGemm> dense_;
};

// Rows from which a batch's layers run faster on the dense fp16 weights (cuBLASLt) than on the
// quantized GEMM (gemm), measured on this GPU for this model: the layer stack of both paths
// timed as CUDA graphs at the step sizes from 2 to 512 rows (those <= max_rows and <= w.n_ctx); the
// smallest probe from which the dense path wins at every larger probe, or INT_MAX. The crossover
// depends on the format (how fast gemm decodes it) and the widths (how well the tensor cores
// fill). w needs its dense copies; ws room for max_rows rows with the dense buffers. Writes KV
// rows [0, probe) of the layers' caches (free at start-up) and clobbers ws. Synchronizes s.
int measure_dense_rows(const StepWeights& w, StepWorkspace& ws, int max_rows, const Launch& stream);

// Where the rows of a multi-sequence step go (device arrays [n]; the layers' k_cache/v_cache are
// then a paged pool's [slots][kv_dim] per layer): row i is token ws.tokens[i] of the sequence
// whose block table is tables[seq[i] * table_stride ..], at position pos[i], its K/V written to
// pool slot slot[i]; attention is attention_paged (cuda/attention_paged.h), and attention_prefill
// for the prompt chunks listed as spans.
struct StepRows {
  const int* pos = nullptr;
  const int* slot = nullptr;
  const int* seq = nullptr;
  const int* first_new = nullptr;  // [n] the first position of the row's sequence in this step
  const int* tables = nullptr;
  int table_stride = 0, page_size = 0;
  float* attn_partials = nullptr;  // attention_paged's scratch for n rows (attention_paged.h)
  int* attn_counters = nullptr;
  // attention_paged's splits (attn_paged_splits of its rows), 0: no rows take it
  int attn_splits = kAttnPagedSplits;
  // Sliding-window layers whose caches are per-sequence rings (set both, or neither): their K/V
  // slots and block tables (a ring's table repeats its pages, so positions wrap through them).
  const int* ring_slot = nullptr;
  const int* ring_tables = nullptr;
  // max_tiles > 0: the step's prompt chunks take attention_prefill over their sequences' block
  // tables (64 queries share each key tile, where attention_paged reads a row's context once per
  // row): spans and tiles as AttentionPrefillArgs::spans / tiles, read on the device, so a step's
  // graph serves any chunks; max_tiles the launch's tile slots. The other rows (one-row entries)
  // take attention_paged through attn_rows (PagedAttnArgs::rows), none when attn_splits is 0.
  const int* spans = nullptr;
  const int* tiles = nullptr;
  int max_tiles = 0;
  const int* attn_rows = nullptr;
  int attn_n = 0;  // attn_rows' length (attention_paged's grid rows)
  // shared.max_blocks > 0: rows that share a prefix (the same first pages) take cascade
  // attention on the layers without a sliding window: attention_paged's shared pass over the
  // shared keys, beside its blocks over the rest.
  SharedPrefix shared;
  // row_table != nullptr: a one-row step (n 1) whose sequence's block table was staged with the
  // step (row_table, stride table_stride), which the split decode attention (attention_decode.h)
  // reads directly; decode_scratch is its split scratch, seq_ctx its context bound.
  const int* row_table = nullptr;
  AttnScratch decode_scratch;
  int seq_ctx = 0;
  // A one-row step: device flag, nonzero when its sequence's pages are consecutive, so its
  // attention finds a row from the first page alone (AttnPages::consecutive). A step with chunks:
  // non-null where their spans may say so (AttentionPrefillArgs::contiguous: each span's fourth
  // int), null on layers whose tables are rings.
  const int* consecutive = nullptr;
  // The rows as layer l of config c sees them: a sliding-window layer takes the rings (whose
  // tables wrap, so they are never consecutive).
  StepRows for_layer(const ModelConfig& c, int l) const {
    StepRows r = *this;
    if (ring_tables && c.is_swa(l))
      r.slot = ring_slot, r.tables = ring_tables, r.consecutive = nullptr;
    return r;
  }
};

// Whether the QKV matvec's or GEMM's epilogue can do the whole of qkv_finish (plain llama: no
// biases, no QK norm, normal RoPE without frequency factors, no sliding window).
bool qkv_fused(const ModelConfig& c);

// One step of n rows: ws.tokens[0..n) already on the device (embedded here when w.token_embd is
// set; else the caller has filled ws.x rows [0, n)), positions pos0..pos0+n-1 (pos0 + n <= n_ctx).
// logits: 0 = none, 1 = last token only (ws.logits row 0, ws.argmax[0]), n = every token.
// Returns the final residual stream's rows (ws.x, or for a one-row step the buffer its fused post
// norms left it in), before the output norm.
// Throws smolrt::Error for shapes the kernels do not support (e.g. head_dim 96).
// rows != nullptr: a multi-sequence step placed by *rows (pos0 ignored; the context check is
// the caller's, per sequence).
const float* step_forward(const StepWeights& w, StepWorkspace& ws, int n, int pos0, int logit_rows,
                          const Launch& stream, const StepRows* rows = nullptr);

}  // namespace smolrt::cuda
