// A model (llama, qwen2 or gemma3): hyperparameters from GGUF metadata and typed weight views by
// role.
// The model owns nothing but a reference to the mapped file; views point into the mapping.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "quant/formats.h"

namespace smolrt {

// The architecture families smolrt runs. A family is not a separate forward pass: it is a set of
// switches on the one block below, read by every backend (CPU oracle, CUDA decode, prefill and
// batch). src/model/model.cpp's load_config says, per family, which GGUF key or documented
// default each switch comes from.
//
// The block, for layer l and a token at position pos (x: the residual stream, [dim]):
//   x   = embed[token] * embed_scale                                   (once, before layer 0)
//   h   = rmsnorm(x, attn_norm)
//   q,k,v = h Wq, h Wk, h Wv   (+ bq, bk, bv when attn_bias)
//   q,k = per-head rmsnorm(q, q_norm), rmsnorm(k, k_norm)            (when qk_norm)
//   q,k = rope(q,k, pos, layer_rope_base(l), rope_freq_factors, rope_neox)
//   a   = softmax(attn_scale * q.k over keys p with p <= pos, and pos - p < sliding_window when
//         is_swa(l)) . v,  then a Wo
//   x  += post_norms ? rmsnorm(a Wo, post_attn_norm) : a Wo
//   h   = rmsnorm(x, ffn_norm)
//   f   = (act(h Wgate) * (h Wup)) Wdown        act: silu or gelu(tanh approximation)
//   x  += post_norms ? rmsnorm(f, post_ffn_norm) : f
// logits = rmsnorm(x, output_norm) Woutput
enum class Arch : uint8_t { Llama, Qwen2, Gemma3 };
enum class FfnAct : uint8_t { Silu, GeluTanh };

const char* arch_name(Arch a);  // "llama" | "qwen2" | "gemma3"

struct ModelConfig {
  std::string arch;           // general.architecture: "llama", "qwen2" or "gemma3"
  Arch family = Arch::Llama;  // the same, parsed
  // Key names below are for llama; other families use their own prefix ("qwen2.", "gemma3.").
  int dim = 0;                // llama.embedding_length (576 for SmolLM-135M)
  int n_layers = 0;           // llama.block_count (30)
  int n_heads = 0;            // llama.attention.head_count (9)
  int n_kv_heads = 0;         // llama.attention.head_count_kv (3)
  int head_dim = 0;           // llama.attention.key_length, default dim / n_heads (64)
  int hidden_dim = 0;         // llama.feed_forward_length (1536)
  int vocab_size = 0;         // rows of token_embd.weight (49152)
  int n_ctx_train = 0;        // llama.context_length (8192 for SmolLM2)
  int rope_dim = 0;           // llama.rope.dimension_count (default head_dim)
  float norm_eps = 1e-5f;     // llama.attention.layer_norm_rms_epsilon
  float rope_base = 10000.f;  // llama.rope.freq_base (gemma3: of the global layers)
  bool tied_output = false;   // output.weight absent -> lm_head is token_embd

  // --- architecture switches (see the block above); the defaults are plain llama
  bool attn_bias = false;     // qwen2: blk.N.attn_{q,k,v}.bias
  bool qk_norm = false;       // gemma3: blk.N.attn_{q,k}_norm.weight, [head_dim]
  bool post_norms = false;    // gemma3: blk.N.post_attention_norm, blk.N.post_ffw_norm
  FfnAct act = FfnAct::Silu;  // gemma3: GeluTanh
  float embed_scale = 1.f;    // gemma3: sqrt(dim)
  float attn_scale = 0.f;     // softmax scale; load_config sets 1/sqrt(head_dim) or the file's
  bool rope_neox = false;     // rotate pairs (i, i + rope_dim/2) instead of (2i, 2i+1)
  std::vector<float>
      rope_freq_factors;   // llama3 scaling: theta_i /= factor_i, [rope_dim/2]; empty = none
  int sliding_window = 0;  // gemma3: keys pos - window < p <= pos on local layers; 0 = none
  std::vector<uint8_t> swa_layers;  // [n_layers], 1 = a local (sliding-window) layer; empty = none
  float rope_base_swa = 10000.f;    // gemma3: RoPE base of the local layers

  int kv_dim() const { return n_kv_heads * head_dim; }
  int q_dim() const { return n_heads * head_dim; }
  bool is_swa(int l) const { return !swa_layers.empty() && swa_layers[size_t(l)] != 0; }
  float layer_rope_base(int l) const { return is_swa(l) ? rope_base_swa : rope_base; }
  // The first key position layer l's attention reads for a query at pos.
  int first_key(int l, int pos) const {
    return is_swa(l) && pos >= sliding_window ? pos - sliding_window + 1 : 0;
  }
};

// A 2-D weight (or 1-D norm vector: rows == 1) as stored: `rows` rows of `cols` elements,
// cols = ne[0] (the input dimension of a matrix-vector product), rows = ne[1] (its output).
struct TensorView {
  std::string name;
  GgmlType type = GgmlType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;
  size_t nbytes = 0;
  size_t row_stride() const { return nbytes / (rows ? rows : 1); }  // bytes per row
};

struct LayerWeights {
  TensorView attn_norm;  // [dim]
  TensorView wq;         // rows q_dim,  cols dim
  TensorView wk;         // rows kv_dim, cols dim
  TensorView wv;         // rows kv_dim, cols dim
  TensorView wo;         // rows dim,    cols q_dim
  TensorView ffn_norm;   // [dim]
  TensorView w_gate;     // rows hidden_dim, cols dim
  TensorView w_up;       // rows hidden_dim, cols dim
  TensorView w_down;     // rows dim,        cols hidden_dim
  // Present only when the config's switch says so (data == nullptr otherwise):
  TensorView bq, bk, bv;                     // attn_bias: [q_dim], [kv_dim], [kv_dim] f32
  TensorView q_norm, k_norm;                 // qk_norm: [head_dim] f32
  TensorView post_attn_norm, post_ffn_norm;  // post_norms: [dim] f32
};

struct Weights {
  TensorView token_embd;   // rows vocab_size, cols dim
  TensorView output_norm;  // [dim]
  TensorView output;       // rows vocab_size, cols dim (== token_embd when tied)
  std::vector<LayerWeights> layers;
};

struct Model {
  std::shared_ptr<gguf::File> file;
  ModelConfig config;
  Weights weights;
};

// Reads and validates hyperparameters; throws Error naming the key (or the unsupported arch).
ModelConfig load_config(const gguf::File& f);
// Maps tensor names to roles and checks every shape and type against the config; throws Error
// naming the tensor, its shape/type and the expected one.
Weights load_weights(const gguf::File& f, const ModelConfig& c);
// open + load_config + load_weights.
Model load_model(const std::string& path);

}  // namespace smolrt
