// Layer-major prefill driver (see prefill_forward.h): launches only, no allocation per chunk.
#include "cuda/prefill_forward.h"

#include <algorithm>

#include "core/cuda_check.h"
#include "core/error.h"
#include "cuda/attention_prefill.h"
#include "cuda/gemm_quant.h"
#include "cuda/prefill_ops.h"

namespace smolrt::cuda {

// --- workspace -----------------------------------------------------------------------------------

PrefillWorkspace::~PrefillWorkspace() {
  release();
}

void PrefillWorkspace::release() {
  for (void* p :
       {(void*)x, (void*)q, (void*)att, (void*)ffh, (void*)logits, (void*)tokens, (void*)argmax})
    if (p) cudaFree(p);
  x = q = att = ffh = logits = nullptr;
  tokens = argmax = nullptr;
  cap_tokens_ = cap_logits_ = 0;
}

void PrefillWorkspace::reserve(const LlamaConfig& c, int max_tokens, int max_logit_rows) {
  const bool same_shape =
      dim_ == c.dim && q_dim_ == c.q_dim() && hidden_ == c.hidden_dim && vocab_ == c.vocab_size;
  if (same_shape && max_tokens <= cap_tokens_ && max_logit_rows <= cap_logits_) return;
  const int nt = std::max(max_tokens, same_shape ? cap_tokens_ : 0);
  const int nl = std::max(std::max(max_logit_rows, 1), same_shape ? cap_logits_ : 0);
  release();
  dim_ = c.dim, q_dim_ = c.q_dim(), hidden_ = c.hidden_dim, vocab_ = c.vocab_size;
  CUDA_CHECK(cudaMalloc(&x, sizeof(float) * nt * dim_));
  CUDA_CHECK(cudaMalloc(&q, sizeof(float) * nt * q_dim_));
  CUDA_CHECK(cudaMalloc(&att, sizeof(float) * nt * q_dim_));
  CUDA_CHECK(cudaMalloc(&ffh, sizeof(float) * nt * hidden_));
  CUDA_CHECK(cudaMalloc(&logits, sizeof(float) * (size_t)nl * vocab_));
  CUDA_CHECK(cudaMalloc(&tokens, sizeof(int) * nt));
  CUDA_CHECK(cudaMalloc(&argmax, sizeof(int) * nl));
  cap_tokens_ = nt;
  cap_logits_ = nl;
}

// --- forward -------------------------------------------------------------------------------------

bool prefill_supported(const LlamaConfig& c, GgmlType layer_type, GgmlType output_type) {
  return layer_type == GgmlType::Q4_0 &&
         (output_type == GgmlType::Q8_0 || output_type == GgmlType::Q4_0) &&
         attention_prefill_supports(c.head_dim) && c.dim % 32 == 0 && c.q_dim() % 32 == 0 &&
         c.hidden_dim % 32 == 0 && c.rope_dim % 2 == 0 && c.rope_dim <= c.head_dim;
}

void prefill_forward(const PrefillWeights& w, PrefillWorkspace& ws, int n, int pos0, int logit_rows,
                     cudaStream_t s) {
  const LlamaConfig& c = w.cfg;
  if (n <= 0 || n > ws.capacity())
    fail("prefill_forward: chunk of ", n, " tokens exceeds the workspace (", ws.capacity(), ")");
  if (pos0 < 0 || pos0 + n > w.n_ctx)
    fail("prefill_forward: positions [", pos0, ", ", pos0 + n, ") exceed the context of ", w.n_ctx,
         " tokens; use a larger --ctx");
  if (logit_rows != 0 && logit_rows != 1 && logit_rows != n)
    fail("prefill_forward: logit_rows must be 0, 1 or n");
  if (logit_rows > ws.logit_capacity())
    fail("prefill_forward: ", logit_rows, " logit rows exceed the workspace");
  if ((int)w.layers.size() != c.n_layers) fail("prefill_forward: layer count mismatch");
  const int dim = c.dim, q_dim = c.q_dim(), kv_dim = c.kv_dim(), hid = c.hidden_dim;

  if (w.token_embd)
    embed_rows(w.token_embd, w.embd_type, c.vocab_size, dim, ws.tokens, n, ws.x, dim, s);
  for (const PrefillLayerWeights& L : w.layers) {
    GemmArgs a;
    a.wtype = GgmlType::Q4_0;
    a.t = n;
    a.eps = c.norm_eps;
    // 1. norm + QKV + RoPE + KV write
    a.w = L.w_qkv, a.n = q_dim + 2 * kv_dim, a.k = dim, a.x = ws.x, a.ldx = dim;
    a.norm_w = L.attn_norm;
    GemmOut o;
    o.y = ws.q, o.ldy = q_dim, o.q_dim = q_dim, o.kv_dim = kv_dim, o.head_dim = c.head_dim;
    o.rope_dim = c.rope_dim, o.rope_base = c.rope_base, o.pos0 = pos0;
    o.k_cache = L.k_cache, o.v_cache = L.v_cache, o.kv_half = w.kv_half;
    gemm_quant(a, GemmEpilogue::QkvRope, o, s);
    // 2. attention
    AttentionPrefillArgs at;
    at.q = ws.q, at.ldq = q_dim, at.k_cache = L.k_cache, at.v_cache = L.v_cache;
    at.kv_half = w.kv_half, at.out = ws.att, at.ldo = q_dim, at.n_tokens = n, at.start = pos0;
    at.n_heads = c.n_heads, at.n_kv_heads = c.n_kv_heads, at.head_dim = c.head_dim;
    attention_prefill(at, s);
    // 3. x += Wo att
    a.w = L.w_o, a.n = dim, a.k = q_dim, a.x = ws.att, a.ldx = q_dim, a.norm_w = nullptr;
    GemmOut r;
    r.y = ws.x, r.ldy = dim;
    gemm_quant(a, GemmEpilogue::Accumulate, r, s);
    // 4. norm + gate/up + silu
    a.w = L.w_gate_up, a.n = 2 * hid, a.k = dim, a.x = ws.x, a.ldx = dim, a.norm_w = L.ffn_norm;
    GemmOut g;
    g.y = ws.ffh, g.ldy = hid;
    gemm_quant(a, GemmEpilogue::SiluPair, g, s);
    // 5. x += Wdown h
    a.w = L.w_down, a.n = dim, a.k = hid, a.x = ws.ffh, a.ldx = hid, a.norm_w = nullptr;
    gemm_quant(a, GemmEpilogue::Accumulate, r, s);
  }
  if (logit_rows == 0) return;
  GemmArgs a;
  a.w = w.output, a.wtype = w.output_type, a.n = c.vocab_size, a.k = dim;
  a.x = ws.x + (size_t)(n - logit_rows) * dim, a.ldx = dim, a.t = logit_rows;
  a.norm_w = w.output_norm, a.eps = c.norm_eps;
  GemmOut o;
  o.y = ws.logits, o.ldy = c.vocab_size;
  gemm_quant(a, GemmEpilogue::Store, o, s);
  argmax_rows(ws.logits, c.vocab_size, c.vocab_size, logit_rows, ws.argmax, s);
}

std::vector<float> prefill_tokens(const PrefillWeights& w, PrefillWorkspace& ws,
                                  std::span<const int> tokens, int pos0, int chunk, bool all_logits,
                                  cudaStream_t s) {
  const int n = (int)tokens.size();
  if (n == 0) fail("prefill_tokens: empty prompt");
  if (chunk <= 0) fail("prefill_tokens: chunk must be positive");
  for (int i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= w.cfg.vocab_size)
      fail("prefill_tokens: token ", tokens[i], " at index ", i, " is outside [0, ",
           w.cfg.vocab_size, ")");
  const int cs = std::min(chunk, n);
  ws.reserve(w.cfg, cs, all_logits ? cs : 1);
  const size_t V = w.cfg.vocab_size;
  std::vector<float> out(all_logits ? (size_t)n * V : V);
  for (int i0 = 0; i0 < n; i0 += cs) {
    const int m = std::min(cs, n - i0);
    CUDA_CHECK(
        cudaMemcpyAsync(ws.tokens, tokens.data() + i0, sizeof(int) * m, cudaMemcpyHostToDevice, s));
    const bool last = i0 + m == n;
    const int rows = all_logits ? m : (last ? 1 : 0);
    prefill_forward(w, ws, m, pos0 + i0, rows, s);
    if (rows > 0) {
      float* dst = all_logits ? out.data() + (size_t)i0 * V : out.data();
      CUDA_CHECK(
          cudaMemcpyAsync(dst, ws.logits, sizeof(float) * rows * V, cudaMemcpyDeviceToHost, s));
    }
  }
  CUDA_CHECK(cudaStreamSynchronize(s));
  return out;
}

}  // namespace smolrt::cuda
