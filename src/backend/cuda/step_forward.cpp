// The CUDA engine's layer loop (see step_forward.h): launches only, no allocation per step.
#include "backend/cuda/step_forward.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <utility>

#include "core/cuda_check.h"
#include "core/error.h"
#include "cuda/attention_decode.h"
#include "cuda/attention_paged.h"
#include "cuda/attention_prefill.h"
#include "cuda/embed.h"
#include "cuda/gemm.h"
#include "cuda/gemv.h"
#include "cuda/prefill_ops.h"
#include "cuda/qkv_finish.h"
#include "cuda/rmsnorm.h"

namespace smolrt::cuda {

// --- workspace -----------------------------------------------------------------------------------

StepWorkspace::~StepWorkspace() {
  release();
}

void StepWorkspace::release() {
  for (void* p : {(void*)x, (void*)q, (void*)att, (void*)ffh, (void*)logits, (void*)tokens,
                  (void*)argmax, (void*)xh, (void*)hh, (void*)k, (void*)v, (void*)tmp,
                  (void*)attn_scratch, (void*)xd, (void*)qkv, (void*)gu, (void*)hd})
    if (p) cudaFree(p);
  x = q = att = ffh = logits = k = v = tmp = attn_scratch = qkv = nullptr;
  tokens = argmax = nullptr;
  xh = hh = xd = gu = hd = nullptr;
  cap_tokens_ = cap_logits_ = 0;
}

void StepWorkspace::reserve_dense(const ModelConfig& c, int max_tokens, int max_logit_rows) {
  if (!dense_) dense_ = std::make_unique<DenseGemm>();
  want_dense_ = true;
  reserve(c, max_tokens, max_logit_rows);
}

void StepWorkspace::reserve(const ModelConfig& c, int max_tokens, int max_logit_rows) {
  const bool same_shape = dim_ == c.dim && q_dim_ == c.q_dim() && kv_dim_ == c.kv_dim() &&
                          heads_ == c.n_heads && hd_ == c.head_dim && hidden_ == c.hidden_dim &&
                          vocab_ == c.vocab_size;
  if (same_shape && max_tokens <= cap_tokens_ && max_logit_rows <= cap_logits_ &&
      (!want_dense_ || xd))
    return;
  const int nt = std::max(max_tokens, same_shape ? cap_tokens_ : 0);
  const int nl = std::max(std::max(max_logit_rows, 1), same_shape ? cap_logits_ : 0);
  release();
  dim_ = c.dim, q_dim_ = c.q_dim(), hidden_ = c.hidden_dim, vocab_ = c.vocab_size;
  kv_dim_ = c.kv_dim(), heads_ = c.n_heads, hd_ = c.head_dim;
  // The unfused architecture path's buffers, only for models that take it.
  if (!qkv_fused(c)) {
    CUDA_CHECK(cudaMalloc(&k, sizeof(float) * nt * kv_dim_));
    CUDA_CHECK(cudaMalloc(&v, sizeof(float) * nt * kv_dim_));
  }
  if (c.post_norms) CUDA_CHECK(cudaMalloc(&tmp, sizeof(float) * nt * dim_));
  if (const size_t n = attention_prefill_scratch(nt, heads_, hd_))
    CUDA_CHECK(cudaMalloc(&attn_scratch, sizeof(float) * n));
  CUDA_CHECK(cudaMalloc(&x, sizeof(float) * nt * dim_));
  CUDA_CHECK(cudaMalloc(&q, sizeof(float) * nt * q_dim_));
  CUDA_CHECK(cudaMalloc(&att, sizeof(float) * nt * q_dim_));
  CUDA_CHECK(cudaMalloc(&ffh, sizeof(float) * nt * hidden_));
  CUDA_CHECK(cudaMalloc(&logits, sizeof(float) * (size_t)nl * vocab_));
  CUDA_CHECK(cudaMalloc(&tokens, sizeof(int) * nt));
  CUDA_CHECK(cudaMalloc(&argmax, sizeof(int) * nl));
  ldh_ = (std::max({dim_, q_dim_, hidden_}) + 63) / 64 * 64;
  CUDA_CHECK(cudaMalloc(&xh, sizeof(uint16_t) * nt * ldh_));
  CUDA_CHECK(cudaMalloc(&hh, sizeof(uint16_t) * nt * ldh_));
  CUDA_CHECK(cudaMemset(xh, 0, sizeof(uint16_t) * nt * ldh_));  // pad columns stay zero
  CUDA_CHECK(cudaMemset(hh, 0, sizeof(uint16_t) * nt * ldh_));
  if (want_dense_) {
    ldd_ = (std::max({dim_, q_dim_, hidden_}) + 7) / 8 * 8;
    CUDA_CHECK(cudaMalloc(&xd, sizeof(uint16_t) * nt * ldd_));
    CUDA_CHECK(cudaMalloc(&hd, sizeof(uint16_t) * nt * ldd_));
    CUDA_CHECK(cudaMalloc(&gu, sizeof(uint16_t) * nt * 2 * hidden_));
    CUDA_CHECK(cudaMalloc(&qkv, sizeof(float) * nt * (q_dim_ + 2 * kv_dim_)));
  }
  cap_tokens_ = nt;
  cap_logits_ = nl;
  ++generation_;
}

// --- forward -------------------------------------------------------------------------------------

namespace {

// Where a layer's attention writes: fp32 (ws.att, the quantized GEMM's input) or fp16 row-major
// (the dense GEMM's input, no conversion launch).
struct AttnOut {
  float* f32 = nullptr;
  uint16_t* f16 = nullptr;
  int ld = 0;
};

// Attention of a multi-sequence step's n rows for one layer: roped queries q (pitch ldq) over the
// paged pool in the layer's k_cache / v_cache (attention_paged, with its shared pass where rows
// share a prefix).
void attention_rows(const StepWeights& w, int l, const float* q, int ldq, const AttnOut& out, int n,
                    const StepRows& rows, const Launch& s) {
  const ModelConfig& c = w.cfg;
  const StepLayerWeights& L = w.layers[l];
  PagedAttnArgs pa;
  pa.q = q, pa.ldq = ldq, pa.k_pool = L.k_cache, pa.v_pool = L.v_cache;
  pa.kv_half = w.kv_half, pa.out = out.f32, pa.out_h = out.f16, pa.ldo = out.ld;
  pa.n = rows.attn_rows ? rows.attn_n : n, pa.rows = rows.attn_rows;
  pa.row_pos = rows.pos, pa.row_seq = rows.seq, pa.row_first_new = rows.first_new,
  pa.tables = rows.tables;
  pa.table_stride = rows.table_stride, pa.page_size = rows.page_size;
  pa.n_heads = c.n_heads, pa.n_kv_heads = c.n_kv_heads, pa.head_dim = c.head_dim;
  pa.partials = rows.attn_partials, pa.counters = rows.attn_counters, pa.splits = rows.attn_splits;
  pa.window = c.is_swa(l) ? c.sliding_window : 0, pa.scale = c.attn_scale;
  if (rows.shared.max_blocks > 0 && pa.window == 0) pa.shared = rows.shared;
  attention_paged(pa, s);
}

}  // namespace

int measure_dense_rows(const StepWeights& w, StepWorkspace& ws, int max_rows, const Launch& s) {
  if (!w.dense_output || w.layers.empty() || !w.layers[0].dense.qkv)
    fail("measure_dense_rows: the model has no dense copies");
  StepWeights quant = w, dense = w;
  quant.dense_rows = INT_MAX, dense.dense_rows = 1;
  quant.token_embd = dense.token_embd = DevMat{};  // the rows of ws.x as they are
  // Best of three graph replays of each path's layer stack (graphs: the engines replay steps).
  auto time_ms = [&](const StepWeights& pw, int n) {
    step_forward(pw, ws, n, 0, 0, s);  // first use: cuBLASLt plans, kernel attributes
    cudaGraph_t g;
    cudaGraphExec_t e;
    CUDA_CHECK(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal));
    step_forward(pw, ws, n, 0, 0, s);
    CUDA_CHECK(cudaStreamEndCapture(s.stream, &g));
    CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    float best = INFINITY;
    for (int i = 0; i < 3; ++i) {
      float ms = 0;
      // Activations of realistic magnitude (not zeros: they would time faster than real data),
      // reset before each replay (the residual stream accumulates in place).
      CUDA_CHECK(cudaMemsetAsync(ws.x, 0x3c, sizeof(float) * size_t(n) * w.cfg.dim, s.stream));
      CUDA_CHECK(cudaEventRecord(e0, s.stream));
      CUDA_CHECK(cudaGraphLaunch(e, s.stream));
      CUDA_CHECK(cudaEventRecord(e1, s.stream));
      CUDA_CHECK(cudaEventSynchronize(e1));
      CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      best = std::min(best, ms);
    }
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    CUDA_CHECK(cudaGraphExecDestroy(e));
    CUDA_CHECK(cudaGraphDestroy(g));
    return best;
  };
  const int cap = std::min({max_rows, ws.capacity(), w.n_ctx});
  int rows = INT_MAX;
  // Probes one or two step sizes apart up to 512 (the multi-sequence engine's graph buckets in
  // cuda_batch.cpp but 1, 4 and 24): the crossover moves with model width and format, and a
  // coarser grid would park it at the next probe up.
  for (int n : {512, 384, 256, 192, 128, 96, 64, 48, 32, 16, 8, 2}) {
    if (n > cap) continue;
    if (time_ms(dense, n) >= time_ms(quant, n)) break;
    rows = n;
  }
  CUDA_CHECK(cudaStreamSynchronize(s.stream));
  return rows;
}

namespace {

// qkv_finish's arguments for layer l: raw Q at q (pitch ldq), raw K and V at k, v (pitch ldkv).
QkvFinishArgs finish_args(const StepWeights& w, int l, int n, int pos0, const StepRows* lrows,
                          float* q, int ldq, const float* k, const float* v, int ldkv) {
  const ModelConfig& c = w.cfg;
  const StepLayerWeights& L = w.layers[l];
  QkvFinishArgs f;
  f.n = n, f.q = q, f.ldq = ldq, f.k = k, f.v = v, f.ldkv = ldkv;
  f.k_cache = L.k_cache, f.v_cache = L.v_cache, f.kv_half = w.kv_half, f.pos0 = pos0;
  if (lrows) f.row_pos = lrows->pos, f.row_slot = lrows->slot;
  f.bq = L.bq, f.bk = L.bk, f.bv = L.bv, f.q_norm = L.q_norm, f.k_norm = L.k_norm;
  f.eps = c.norm_eps, f.n_heads = c.n_heads, f.n_kv_heads = c.n_kv_heads;
  f.head_dim = c.head_dim, f.rope_dim = c.rope_dim, f.rope_base = c.layer_rope_base(l);
  f.neox = c.rope_neox, f.freq_factors = w.rope_factors;
  return f;
}

// The residual stream of a one-row step. add(): x += W·in in the matvec's epilogue; with a post
// norm (gemma3), x += rmsnorm(W·in)·post_norm, where W·in goes to tmp and the update is left
// pending for the next matvec, whose input staging makes it (gemv.h ResidualIn) and writes the sum
// to the other of two buffers: take() hands it over and from then on x() is that buffer. flush()
// makes a pending update with rmsnorm_add where no matvec of ours follows (the output head). That
// saves a launch per post norm (gemma3-270m: 35 of 147 per step).
class RowResidual {
 public:
  RowResidual(const ModelConfig& c, float* x, float* alt, float* tmp)
      : c_(c), x_(x), alt_(alt), tmp_(tmp) {}
  float* x() const { return x_; }
  void add(const DevMat& w, const float* in, const float* post_norm, const Launch& s) {
    flush(s);  // an update no matvec took
    if (!post_norm) return gemv(w, in, nullptr, c_.norm_eps, x_, /*accumulate=*/true, s);
    gemv(w, in, nullptr, c_.norm_eps, tmp_, /*accumulate=*/false, s);
    pending_norm_ = post_norm;
  }
  // For the next matvec on x(): the pending update (all null: none), after which x() is where
  // that matvec writes the updated stream. Call it once per such matvec, right before it.
  ResidualIn take(const float** x_in) {
    *x_in = x_;
    if (!pending_norm_) return {};
    const ResidualIn r{tmp_, pending_norm_, alt_};
    pending_norm_ = nullptr;
    std::swap(x_, alt_);
    return r;
  }
  void flush(const Launch& s) {
    if (!pending_norm_) return;
    rmsnorm_add(x_, c_.dim, tmp_, c_.dim, pending_norm_, c_.dim, 1, c_.norm_eps, s);
    pending_norm_ = nullptr;
  }

 private:
  const ModelConfig& c_;
  float* x_;
  float* alt_;
  float* tmp_;
  const float* pending_norm_ = nullptr;
};

}  // namespace

bool qkv_fused(const ModelConfig& c) {
  // Sliding-window models take qkv_finish, as they were tested and measured; the engine's rings
  // are pool slots, which the fused epilogue could write too (not measured).
  return !c.attn_bias && !c.qk_norm && !c.rope_neox && c.rope_freq_factors.empty() &&
         c.sliding_window == 0;
}

const float* step_forward(const StepWeights& w, StepWorkspace& ws, int n, int pos0, int logit_rows,
                          const Launch& s, const StepRows* rows) {
  const ModelConfig& c = w.cfg;
  if (n <= 0 || n > ws.capacity())
    fail("step_forward: chunk of ", n, " tokens exceeds the workspace (", ws.capacity(), ")");
  if (!rows && (pos0 < 0 || pos0 + n > w.n_ctx))
    fail("step_forward: positions [", pos0, ", ", pos0 + n, ") exceed the context of ", w.n_ctx,
         " tokens; use a larger --ctx");
  if (logit_rows != 0 && logit_rows != 1 && logit_rows != n)
    fail("step_forward: logit_rows must be 0, 1 or n");
  if (logit_rows > ws.logit_capacity())
    fail("step_forward: ", logit_rows, " logit rows exceed the workspace");
  if ((int)w.layers.size() != c.n_layers) fail("step_forward: layer count mismatch");
  const bool one_row = rows && rows->row_table;
  if (one_row && (n != 1 || rows->max_tiles || !rows->decode_scratch.partials || ws.capacity() < 2))
    fail("step_forward: a one-row step is one row (and a workspace of two) with its scratch");
  const int dim = c.dim, q_dim = c.q_dim(), kv_dim = c.kv_dim(), hid = c.hidden_dim;
  const float eps = c.norm_eps;
  const bool fused = qkv_fused(c);

  // How the step's matmuls run: the GEMVs (a one-row step: built for latency), the quantized
  // GEMM, or cuBLASLt on the fp16 copies (large steps).
  enum Path { kRow, kGemm, kDense };
  const Path path = one_row ? kRow : w.dense() && n >= w.dense_rows ? kDense : kGemm;
  if (path == kDense && !ws.has_dense()) fail("step_forward: the workspace has no dense buffers");

  if (w.token_embd.q) embed(w.token_embd, ws.tokens, n, ws.x, dim, s, c.embed_scale);
  // The GEMM path: large chunks' GEMM inputs go through act_to_f16 once (fp16, fragment order,
  // norm applied) and the GEMMs stage them as they are; small ones fuse the norm and the
  // conversion into the GEMM. The down GEMM reads act(gate)*up as fp16 from kDownF16MinTokens on:
  // no conversion in the GEMM and half the staging bytes.
  const bool h = n >= kGemmF16MinTokens;
  const bool down_f16 = h || n >= kDownF16MinTokens;
  const int ldh = ws.ldh(), ldd = ws.ldd(), qkv_ld = q_dim + 2 * kv_dim;
  auto input = [&](GemmArgs& a, float* x, int k, const float* norm_w) {
    if (!h) {
      a.x = x, a.ldx = k, a.norm_w = norm_w;
    } else {
      act_to_f16(x, k, n, k, norm_w, eps, ws.xh, ldh, s);
      a.xh = ws.xh, a.ldh = ldh;
    }
  };
  // The one-row path's residual stream: row 0 of ws.x, row 1 its second buffer.
  RowResidual row_res(c, ws.x, ws.x + dim, ws.tmp);
  // x += W·in, or x += rmsnorm(W·in)·post_norm (gemma3's post norms). `in`: fp32 (the one-row
  // path; the GEMM path unless in_h, fp16 in fragment order at pitch ldh, is given), or in_d, fp16
  // row-major at pitch ldd (the dense path).
  auto residual = [&](const DevMat& wm, const uint16_t* wd, int k, float* in, uint16_t* in_h,
                      const uint16_t* in_d, const float* post_norm) {
    if (path == kRow) return row_res.add(wm, in, post_norm, s);
    GemmOut r;
    r.y = post_norm ? ws.tmp : ws.x, r.ldy = dim;
    if (path == kDense) {
      ws.dense().run(wd, dim, k, in_d, ldd, n, {r.y, dim, false, !post_norm}, s);
    } else {
      GemmArgs b;
      b.t = n, b.w0 = wm;
      if (in_h) {
        b.xh = in_h, b.ldh = ldh;
      } else {
        input(b, in, k, nullptr);
      }
      gemm(b, post_norm ? GemmEpilogue::Store : GemmEpilogue::Accumulate, r, s);
    }
    if (post_norm) rmsnorm_add(ws.x, dim, ws.tmp, dim, post_norm, dim, n, eps, s);
  };

  for (int l = 0; l < c.n_layers; ++l) {
    const StepLayerWeights& L = w.layers[l];
    const DenseLayer& D = L.dense;
    StepRows layer_rows;
    const StepRows* lrows = nullptr;
    if (rows) layer_rows = rows->for_layer(c, l), lrows = &layer_rows;

    // 1. norm + QKV + finish (biases, QK norms, RoPE) + K/V into the cache: fused in the matvec's
    //    or GEMM's epilogue (plain llama), or raw Q, K, V and then qkv_finish. q: the roped
    //    queries, pitch ldq.
    float* q = ws.q;
    int ldq = q_dim;
    if (path == kRow) {
      const float* x = nullptr;
      QkvArgs qa;
      qa.res = row_res.take(&x);
      qa.wq = L.wq, qa.wk = L.wk, qa.wv = L.wv, qa.x = x, qa.norm_w = L.attn_norm, qa.eps = eps;
      qa.head_dim = c.head_dim, qa.rope_dim = c.rope_dim, qa.rope_base = c.layer_rope_base(l);
      qa.pos = lrows->pos, qa.rope = fused, qa.slot = lrows->slot, qa.q_out = ws.q;
      qa.k_out = fused ? L.k_cache : ws.k;
      qa.v_out = fused ? L.v_cache : ws.v;
      qa.kv_half = w.kv_half;  // read by the fused epilogue only
      gemv_qkv(qa, s);
      if (!fused) qkv_finish(finish_args(w, l, 1, 0, lrows, ws.q, q_dim, ws.k, ws.v, kv_dim), s);
    } else if (path == kDense) {
      act_to_f16(ws.x, dim, n, dim, L.attn_norm, eps, ws.xd, ldd, s, F16Order::kRowMajor);
      ws.dense().run(D.qkv, qkv_ld, dim, ws.xd, ldd, n, {ws.qkv, qkv_ld, false, false}, s);
      q = ws.qkv, ldq = qkv_ld;
      qkv_finish(finish_args(w, l, n, pos0, lrows, ws.qkv, qkv_ld, ws.qkv + q_dim,
                             ws.qkv + q_dim + kv_dim, qkv_ld),
                 s);
    } else {
      GemmArgs a;
      a.t = n, a.eps = eps, a.w0 = L.wq, a.w1 = L.wk, a.w2 = L.wv;
      input(a, ws.x, dim, L.attn_norm);
      // Unfused: raw Q, K, V in one launch (one grid over all their rows: K and V alone are a
      // few blocks each), the QkvRope epilogue rotating nothing (rope_dim 0) with ws.k / ws.v as
      // its "caches" at rows 0..n-1.
      GemmOut o;
      o.y = ws.q, o.ldy = q_dim, o.q_dim = q_dim, o.kv_dim = kv_dim, o.head_dim = c.head_dim;
      o.rope_dim = fused ? c.rope_dim : 0, o.rope_base = c.layer_rope_base(l);
      o.pos0 = fused ? pos0 : 0, o.kv_half = fused && w.kv_half;
      o.k_cache = fused ? L.k_cache : ws.k, o.v_cache = fused ? L.v_cache : ws.v;
      if (fused && lrows) o.row_pos = lrows->pos, o.row_slot = lrows->slot;
      gemm(a, GemmEpilogue::QkvRope, o, s);
      if (!fused) qkv_finish(finish_args(w, l, n, pos0, lrows, ws.q, q_dim, ws.k, ws.v, kv_dim), s);
    }

    // 2. attention: fp32 into ws.att, or fp16 row-major into ws.xd (the dense GEMM's input).
    float* att = path == kDense ? nullptr : ws.att;
    uint16_t* att_h = path == kDense ? ws.xd : nullptr;
    const int ld_att = path == kDense ? ldd : q_dim;
    const int window = c.is_swa(l) ? c.sliding_window : 0;
    if (path == kRow) {
      // The split decode attention over the staged table (a ring layer: its fixed ring table).
      const bool ring = rows->ring_tables && c.is_swa(l);
      const AttnPages pages{ring ? lrows->tables : rows->row_table,
                            ring ? lrows->seq : nullptr,
                            lrows->table_stride,
                            lrows->page_size,
                            w.kv_half,
                            lrows->consecutive};
      attention_decode(ws.att, ws.q, L.k_cache, L.v_cache, lrows->pos, rows->seq_ctx, c.n_heads,
                       c.n_kv_heads, c.head_dim, rows->decode_scratch, s, pages, window,
                       c.attn_scale);
    } else {
      if (lrows && lrows->attn_splits > 0)
        attention_rows(w, l, q, ldq, {att, att_h, ld_att}, n, *lrows, s);
      if (!lrows || lrows->max_tiles > 0) {
        AttentionPrefillArgs at;
        at.q = q, at.ldq = ldq, at.k_cache = L.k_cache, at.v_cache = L.v_cache;
        at.kv_half = w.kv_half, at.out = att, at.out_h = att_h, at.ldo = ld_att;
        at.n_tokens = n, at.start = pos0;
        if (lrows) {  // the step's prompt chunks in the paged pool, through their tables
          at.spans = lrows->spans, at.tiles = lrows->tiles, at.max_tiles = lrows->max_tiles;
          at.table = lrows->tables, at.table_stride = lrows->table_stride;
          at.page_size = lrows->page_size, at.contiguous = lrows->consecutive != nullptr;
        }
        at.n_heads = c.n_heads, at.n_kv_heads = c.n_kv_heads, at.head_dim = c.head_dim;
        at.window = window, at.scale = c.attn_scale, at.partials = ws.attn_scratch;
        attention_prefill(at, s);
      }
    }

    // 3. x += Wo att (post norm)
    residual(L.wo, D.o, q_dim, ws.att, nullptr, ws.xd, L.post_attn_norm);

    // 4. norm + gate/up + act into ws.ffh (the GEMM path from kDownF16MinTokens on: fp16 in
    //    fragment order into ws.hh, the down GEMM's input as is; the dense path: ws.hd)
    if (path == kRow) {
      const float* x = nullptr;
      const ResidualIn ri = row_res.take(&x);
      gemv_gate_up(L.w_gate, L.w_up, x, L.ffn_norm, eps, ws.ffh, s, static_cast<int>(c.act), ri);
    } else if (path == kDense) {
      act_to_f16(ws.x, dim, n, dim, L.ffn_norm, eps, ws.xd, ldd, s, F16Order::kRowMajor);
      ws.dense().run(D.gate_up, 2 * hid, dim, ws.xd, ldd, n, {ws.gu, 2 * hid, true, false}, s);
      gated_act(ws.gu, 2 * hid, n, hid, static_cast<int>(c.act), ws.hd, ldd, s);
    } else {
      GemmArgs g;
      g.t = n, g.eps = eps, g.w0 = L.w_gate, g.w1 = L.w_up;
      input(g, ws.x, dim, L.ffn_norm);
      GemmOut go;
      go.y = ws.ffh, go.ldy = hid, go.act = static_cast<int>(c.act);
      if (down_f16) go.yh = ws.hh, go.ldyh = ldh;
      gemm(g, GemmEpilogue::GatePair, go, s);
    }

    // 5. x += Wdown h (post norm)
    residual(L.w_down, D.down, hid, ws.ffh, down_f16 ? ws.hh : nullptr, ws.hd, L.post_ffn_norm);
  }
  row_res.flush(s);
  const float* x = path == kRow ? row_res.x() : ws.x;
  if (logit_rows == 0) return x;
  // The decode lm_head (fused output norm), one launch per row: the last-token case is one launch,
  // and every row's logits are bit-identical to the decode step's.
  for (int i = 0; i < logit_rows; ++i)
    gemv(w.output, x + (size_t)(n - logit_rows + i) * dim, w.output_norm, eps,
         ws.logits + (size_t)i * c.vocab_size, /*accumulate=*/false, s);
  argmax_rows(ws.logits, c.vocab_size, c.vocab_size, logit_rows, ws.argmax, s);
  return x;
}

}  // namespace smolrt::cuda
