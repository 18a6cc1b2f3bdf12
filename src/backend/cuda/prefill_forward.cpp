// Layer-major prefill driver (see prefill_forward.h): launches only, no allocation per chunk.
#include "backend/cuda/prefill_forward.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <utility>

#include "backend/cuda/decode_layer.h"
#include "core/cuda_check.h"
#include "core/error.h"
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

PrefillWorkspace::~PrefillWorkspace() {
  release();
}

void PrefillWorkspace::release() {
  for (void* p : {(void*)x, (void*)q, (void*)att, (void*)ffh, (void*)logits, (void*)tokens,
                  (void*)argmax, (void*)xh, (void*)hh, (void*)k, (void*)v, (void*)tmp,
                  (void*)attn_scratch, (void*)xd, (void*)qkv, (void*)gu, (void*)hd})
    if (p) cudaFree(p);
  x = q = att = ffh = logits = k = v = tmp = attn_scratch = qkv = nullptr;
  tokens = argmax = nullptr;
  xh = hh = xd = gu = hd = nullptr;
  cap_tokens_ = cap_logits_ = 0;
}

void PrefillWorkspace::reserve_dense(const ModelConfig& c, int max_tokens, int max_logit_rows) {
  if (!dense_) dense_ = std::make_unique<DenseGemm>();
  want_dense_ = true;
  reserve(c, max_tokens, max_logit_rows);
}

void PrefillWorkspace::reserve(const ModelConfig& c, int max_tokens, int max_logit_rows) {
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
// paged pool in the layer's k_cache / v_cache (attention_paged).
void attention_rows(const PrefillWeights& w, int l, const float* q, int ldq, const AttnOut& out,
                    int n, const StepRows& rows, const Launch& s) {
  const ModelConfig& c = w.cfg;
  const PrefillLayerWeights& L = w.layers[l];
  PagedAttnArgs pa;
  pa.q = q, pa.ldq = ldq, pa.k_pool = L.k_cache, pa.v_pool = L.v_cache;
  pa.kv_half = w.kv_half, pa.out = out.f32, pa.out_h = out.f16, pa.ldo = out.ld, pa.n = n;
  pa.row_pos = rows.pos, pa.row_seq = rows.seq, pa.row_first_new = rows.first_new,
  pa.tables = rows.tables;
  pa.table_stride = rows.table_stride, pa.page_size = rows.page_size;
  pa.n_heads = c.n_heads, pa.n_kv_heads = c.n_kv_heads, pa.head_dim = c.head_dim;
  pa.partials = rows.attn_partials, pa.counters = rows.attn_counters, pa.splits = rows.attn_splits;
  pa.window = c.is_swa(l) ? c.sliding_window : 0, pa.scale = c.attn_scale;
  attention_paged(pa, s);
}

}  // namespace

int measure_dense_rows(const PrefillWeights& w, PrefillWorkspace& ws, int max_rows,
                       const Launch& s) {
  if (!w.dense_output || w.layers.empty() || !w.layers[0].dense.qkv)
    fail("measure_dense_rows: the model has no dense copies");
  PrefillWeights quant = w, dense = w;
  quant.dense_rows = INT_MAX, dense.dense_rows = 1;
  quant.token_embd = dense.token_embd = DevMat{};  // the rows of ws.x as they are
  // Best of three graph replays of each path's layer stack (graphs: the engines replay steps).
  auto time_ms = [&](const PrefillWeights& pw, int n) {
    prefill_forward(pw, ws, n, 0, 0, s);  // first use: cuBLASLt plans, kernel attributes
    cudaGraph_t g;
    cudaGraphExec_t e;
    CUDA_CHECK(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal));
    prefill_forward(pw, ws, n, 0, 0, s);
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
QkvFinishArgs finish_args(const PrefillWeights& w, int l, int n, int pos0, const StepRows* lrows,
                          float* q, int ldq, const float* k, const float* v, int ldkv) {
  const ModelConfig& c = w.cfg;
  const PrefillLayerWeights& L = w.layers[l];
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

}  // namespace

void prefill_forward(const PrefillWeights& w, PrefillWorkspace& ws, int n, int pos0, int logit_rows,
                     const Launch& s, const StepRows* rows) {
  const ModelConfig& c = w.cfg;
  if (n <= 0 || n > ws.capacity())
    fail("prefill_forward: chunk of ", n, " tokens exceeds the workspace (", ws.capacity(), ")");
  if (!rows && (pos0 < 0 || pos0 + n > w.n_ctx))
    fail("prefill_forward: positions [", pos0, ", ", pos0 + n, ") exceed the context of ", w.n_ctx,
         " tokens; use a larger --ctx");
  if (logit_rows != 0 && logit_rows != 1 && logit_rows != n)
    fail("prefill_forward: logit_rows must be 0, 1 or n");
  if (logit_rows > ws.logit_capacity())
    fail("prefill_forward: ", logit_rows, " logit rows exceed the workspace");
  if ((int)w.layers.size() != c.n_layers) fail("prefill_forward: layer count mismatch");
  const int dim = c.dim, q_dim = c.q_dim(), kv_dim = c.kv_dim(), hid = c.hidden_dim;

  if (w.token_embd.q) embed(w.token_embd, ws.tokens, n, ws.x, dim, s, c.embed_scale);
  // Large chunks: GEMM inputs go through act_to_f16 once (fp16, fragment order, norm applied) and
  // the GEMMs stage them as they are; small ones fuse the norm and the conversion into the GEMM.
  const bool h = n >= kGemmF16MinTokens;
  // The down GEMM reads act(gate)*up as fp16 from kDownF16MinTokens on: no conversion in the
  // GEMM and half the staging bytes, so those chunks run faster.
  const bool down_f16 = h || n >= kDownF16MinTokens;
  const bool fused = qkv_fused(c);
  const int ldh = ws.ldh();
  auto input = [&](GemmArgs& a, float* x, int k, const float* norm_w) {
    if (!h) {
      a.x = x, a.ldx = k, a.norm_w = norm_w;
    } else {
      act_to_f16(x, k, n, k, norm_w, c.norm_eps, ws.xh, ldh, s);
      a.xh = ws.xh, a.ldh = ldh;
    }
  };
  // x += b's product, or x += rmsnorm(product, post_norm) (gemma3's post norms).
  auto residual = [&](const GemmArgs& b, const float* post_norm) {
    GemmOut r;
    if (!post_norm) {
      r.y = ws.x, r.ldy = dim;
      gemm(b, GemmEpilogue::Accumulate, r, s);
      return;
    }
    r.y = ws.tmp, r.ldy = dim;
    gemm(b, GemmEpilogue::Store, r, s);
    rmsnorm_add(ws.x, dim, ws.tmp, dim, post_norm, dim, n, c.norm_eps, s);
  };
  auto attention = [&](int l, const float* q, int ldq, const StepRows* lrows, const AttnOut& out) {
    if (lrows && !lrows->chunk) return attention_rows(w, l, q, ldq, out, n, *lrows, s);
    const PrefillLayerWeights& L = w.layers[l];
    AttentionPrefillArgs at;
    at.q = q, at.ldq = ldq, at.k_cache = L.k_cache, at.v_cache = L.v_cache;
    at.kv_half = w.kv_half, at.out = out.f32, at.out_h = out.f16, at.ldo = out.ld;
    at.n_tokens = n, at.start = pos0;
    if (lrows) {  // one sequence's chunk in the paged pool: its span, through its table
      at.span = lrows->chunk;
      at.table = lrows->tables, at.table_stride = lrows->table_stride;
      at.page_size = lrows->page_size, at.contiguous = lrows->consecutive != nullptr;
    }
    at.n_heads = c.n_heads, at.n_kv_heads = c.n_kv_heads, at.head_dim = c.head_dim;
    at.window = c.is_swa(l) ? c.sliding_window : 0, at.scale = c.attn_scale;
    at.partials = ws.attn_scratch;
    attention_prefill(at, s);
  };
  // The dense path (large batches): fp16 inputs, cuBLASLt GEMMs on the fp16 weight copies, the
  // architecture's QKV finish, norms and activation as their own launches.
  const bool dense = w.dense() && n >= w.dense_rows;
  if (dense && !ws.has_dense()) fail("prefill_forward: the workspace has no dense buffers");
  const int ldd = ws.ldd(), qkv_ld = q_dim + 2 * kv_dim;
  auto dense_residual = [&](const uint16_t* wm, int k, const uint16_t* x, const float* post_norm) {
    if (!post_norm) return ws.dense().run(wm, dim, k, x, ldd, n, {ws.x, dim, false, true}, s);
    ws.dense().run(wm, dim, k, x, ldd, n, {ws.tmp, dim, false, false}, s);
    rmsnorm_add(ws.x, dim, ws.tmp, dim, post_norm, dim, n, c.norm_eps, s);
  };
  auto dense_layer = [&](int l, const StepRows* lrows) {
    const PrefillLayerWeights& L = w.layers[l];
    const DenseLayer& D = L.dense;
    const auto rm = F16Order::kRowMajor;
    act_to_f16(ws.x, dim, n, dim, L.attn_norm, c.norm_eps, ws.xd, ldd, s, rm);
    ws.dense().run(D.qkv, qkv_ld, dim, ws.xd, ldd, n, {ws.qkv, qkv_ld, false, false}, s);
    qkv_finish(finish_args(w, l, n, pos0, lrows, ws.qkv, qkv_ld, ws.qkv + q_dim,
                           ws.qkv + q_dim + kv_dim, qkv_ld),
               s);
    attention(l, ws.qkv, qkv_ld, lrows, {nullptr, ws.xd, ldd});
    dense_residual(D.o, q_dim, ws.xd, L.post_attn_norm);
    act_to_f16(ws.x, dim, n, dim, L.ffn_norm, c.norm_eps, ws.xd, ldd, s, rm);
    ws.dense().run(D.gate_up, 2 * hid, dim, ws.xd, ldd, n, {ws.gu, 2 * hid, true, false}, s);
    gated_act(ws.gu, 2 * hid, n, hid, static_cast<int>(c.act), ws.hd, ldd, s);
    dense_residual(D.down, hid, ws.hd, L.post_ffn_norm);
  };
  for (int l = 0; l < c.n_layers; ++l) {
    const PrefillLayerWeights& L = w.layers[l];
    StepRows layer_rows;
    const StepRows* lrows = nullptr;
    if (rows) layer_rows = rows->for_layer(c, l), lrows = &layer_rows;
    if (dense) {
      dense_layer(l, lrows);
      continue;
    }
    // 1. norm + QKV + RoPE + KV write: fused in the GEMM epilogue (plain llama), or the GEMMs
    //    store raw Q, K, V and qkv_finish applies the architecture's biases, norms and RoPE
    GemmArgs a;
    a.t = n;
    a.eps = c.norm_eps;
    a.w0 = L.wq, a.w1 = L.wk, a.w2 = L.wv;
    input(a, ws.x, dim, L.attn_norm);
    if (fused) {
      GemmOut o;
      o.y = ws.q, o.ldy = q_dim, o.q_dim = q_dim, o.kv_dim = kv_dim, o.head_dim = c.head_dim;
      o.rope_dim = c.rope_dim, o.rope_base = c.layer_rope_base(l), o.pos0 = pos0;
      o.k_cache = L.k_cache, o.v_cache = L.v_cache, o.kv_half = w.kv_half;
      if (lrows) o.row_pos = lrows->pos, o.row_slot = lrows->slot;
      gemm(a, GemmEpilogue::QkvRope, o, s);
    } else {
      // Raw Q, K, V in one launch (one grid over all their rows: K and V alone are a few
      // blocks each): the QkvRope epilogue rotating nothing (rope_dim 0), with ws.k / ws.v as
      // its "caches" at rows 0..n-1.
      GemmOut o;
      o.y = ws.q, o.ldy = q_dim, o.q_dim = q_dim, o.kv_dim = kv_dim, o.head_dim = c.head_dim;
      o.rope_dim = 0, o.pos0 = 0, o.k_cache = ws.k, o.v_cache = ws.v, o.kv_half = false;
      gemm(a, GemmEpilogue::QkvRope, o, s);
      qkv_finish(finish_args(w, l, n, pos0, lrows, ws.q, q_dim, ws.k, ws.v, kv_dim), s);
    }
    // 2. attention
    attention(l, ws.q, q_dim, lrows, {ws.att, nullptr, q_dim});
    // 3. x += Wo att (post norm)
    GemmArgs b;
    b.t = n, b.w0 = L.wo;
    input(b, ws.att, q_dim, nullptr);
    residual(b, L.post_attn_norm);
    // 4. norm + gate/up + act; from kDownF16MinTokens on written as fp16 in fragment order,
    //    the down GEMM's input as is
    GemmArgs g;
    g.t = n, g.eps = c.norm_eps, g.w0 = L.w_gate, g.w1 = L.w_up;
    input(g, ws.x, dim, L.ffn_norm);
    GemmOut go;
    go.y = ws.ffh, go.ldy = hid, go.act = static_cast<int>(c.act);
    if (down_f16) go.yh = ws.hh, go.ldyh = ldh;
    gemm(g, GemmEpilogue::GatePair, go, s);
    // 5. x += Wdown h (post norm)
    GemmArgs d;
    d.t = n, d.w0 = L.w_down;
    if (down_f16) {
      d.xh = ws.hh, d.ldh = ldh;
    } else {
      d.x = ws.ffh, d.ldx = hid;
    }
    residual(d, L.post_ffn_norm);
  }
  if (logit_rows == 0) return;
  // The decode lm_head (fused output norm), one launch per row: the last-token case is one launch,
  // and every row's logits are bit-identical to the decode step's.
  for (int i = 0; i < logit_rows; ++i)
    gemv(w.output, ws.x + (size_t)(n - logit_rows + i) * dim, w.output_norm, c.norm_eps,
         ws.logits + (size_t)i * c.vocab_size, /*accumulate=*/false, s);
  argmax_rows(ws.logits, c.vocab_size, c.vocab_size, logit_rows, ws.argmax, s);
}

}  // namespace smolrt::cuda
