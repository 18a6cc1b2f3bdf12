// CPU reference ops: straight-line fp32, the oracle ("CPU twin") every CUDA kernel is tested
// against. Single-threaded unless a function says otherwise; no allocation inside.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/model.h"
#include "quant/formats.h"

namespace smolrt::cpu {

// out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i], i < n. out may alias x.
void rmsnorm(float* out, const float* x, const float* w, int n, float eps);

// Error unless w's type has a CPU kernel (oracle and fast path alike) and its rows are whole
// blocks.
void check_computable(const TensorView& w);

// Row r of a weight in any computable type, dequantized to f32 (cols elements).
void dequantize(const TensorView& w, int64_t r, float* out);

// out[r] = dot(W[r,:], x) for r in [r0, r1): dequantizes each row in f32, accumulates in f32.
void gemv_rows(float* out, const TensorView& w, const float* x, int64_t r0, int64_t r1);
// All rows, split over n_threads threads (0 = hardware concurrency).
void gemv(float* out, const TensorView& w, const float* x, int n_threads = 1);
// n vectors at once: out[j * rows + r] = dot(W[r,:], x[j * cols ..]), j < n. Each weight row is
// read once for all n (what makes a multi-token step cheaper than n gemv calls); every output is
// bit-identical to gemv's.
void gemm(float* out, const TensorView& w, const float* x, int n, int n_threads = 1);

// Embedding row `token` of token_embd (any computable type) -> f32 [cols].
void embed(float* out, const TensorView& embd, int token);

// RoPE, "normal" GGUF llama style: rotate adjacent pairs (2i, 2i+1), i < rope_dim/2, of each of
// n_heads heads (head_dim apart) by angle pos * base^(-2i/rope_dim). In place.
void rope(float* v, int n_heads, int head_dim, int rope_dim, int pos, float base);
// The general form (ggml_rope_ext): pair i of a head is (2i, 2i+1), or with neox (i, i +
// rope_dim/2) (qwen2, gemma3: HF rotate_half); angle pos * base^(-2i/rope_dim) / freq_factors[i]
// when freq_factors is non-null ([rope_dim/2], llama3 scaling). Dimensions >= rope_dim are left
// as they are. rope(...) == rope_ext(..., false, nullptr) bit for bit.
void rope_ext(float* v, int n_heads, int head_dim, int rope_dim, int pos, float base, bool neox,
              const float* freq_factors);

// rope_ext in two halves, for callers that rotate many vectors at one position and base (every
// layer of a forward step): rope_angles writes cs[2i] = cos, cs[2i + 1] = sin of pair i's angle
// (i < rope_dim / 2), rope_apply rotates with them. Together bit-identical to rope_ext.
void rope_angles(float* cs, int rope_dim, int pos, float base, const float* freq_factors);
void rope_apply(float* v, int n_heads, int head_dim, int rope_dim, bool neox, const float* cs);

// Per-head RMSNorm (gemma3's q/k norm): each of n_heads vectors of head_dim values (contiguous)
// becomes rmsnorm(v_h, w, eps) with the one weight w [head_dim]. In place.
void head_rmsnorm(float* v, int n_heads, int head_dim, const float* w, float eps);

// The CPU twin of cuda::qkv_finish for one token, in place: + biases (qwen2), per-head RMSNorm of
// q and k (gemma3), then RoPE by angles cs from rope_angles (normal or neox pairs). Any of bq, bk,
// bv, q_norm, k_norm may be null (absent).
struct QkvFinishShape {
  int n_heads = 0, n_kv_heads = 0, head_dim = 0, rope_dim = 0;
  bool neox = false;
  float eps = 1e-6f;  // of the q/k norms
};
void qkv_finish(float* q, float* k, float* v, const QkvFinishShape& s, const float* bq,
                const float* bk, const float* bv, const float* q_norm, const float* k_norm,
                const float* cs);

// Causal grouped-query attention for one query token at position n_pos-1.
// q: [n_heads*head_dim]; k_cache, v_cache: [n_pos][n_kv_heads*head_dim]; out: [n_heads*head_dim].
// Query head h reads KV head h / (n_heads / n_kv_heads); scale 1/sqrt(head_dim).
// scratch: at least n_pos floats.
void attention_decode(float* out, const float* q, const float* k_cache, const float* v_cache,
                      int n_pos, int n_heads, int n_kv_heads, int head_dim, float* scratch);
// The same over a paged KV pool (bit-identical results): position t's row is row t % page_size
// of page pages[t / page_size], i.e. at pool + (pages[t / page_size] * page_size + t % page_size)
// * n_kv_heads*head_dim. pages: at least ceil(n_pos / page_size) entries.
// first: the first key position read (a sliding window: ModelConfig::first_key); keys before it
// are never touched (their pages need not exist). scale: the softmax scale, 0 = 1/sqrt(head_dim).
// With first = 0 and scale 0 the result is bit-identical to before these parameters existed.
void attention_paged(float* out, const float* q, const float* k_pool, const float* v_pool,
                     const int* pages, int page_size, int n_pos, int n_heads, int n_kv_heads,
                     int head_dim, float* scratch, int first = 0, float scale = 0.f);

// logits with the tokens `allowed` leaves out set to -inf (a copy in `buf`), or logits itself when
// allowed is empty (bit t of word t / 32 allows token t: SeqStep::allowed).
std::span<const float> mask_logits(std::span<const float> logits, std::span<const uint32_t> allowed,
                                   std::vector<float>& buf);

// out[i] = silu(gate[i]) * up[i]; silu(x) = x / (1 + exp(-x)).
void silu_mul(float* out, const float* gate, const float* up, int n);
// out[i] = gelu(gate[i]) * up[i] with the tanh approximation (ggml_gelu, HF gelu_pytorch_tanh):
// gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_tanh_mul(float* out, const float* gate, const float* up, int n);

// Index of the largest value; ties -> lowest index; NaN never wins (all-NaN -> 0).
int argmax(const float* x, int n);

}  // namespace smolrt::cpu
