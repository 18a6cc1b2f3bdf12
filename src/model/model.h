// A llama-family model: hyperparameters from GGUF metadata and typed weight views by role.
// The model owns nothing but a reference to the mapped file; views point into the mapping.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "quant/formats.h"

namespace smolrt {

struct LlamaConfig {
  std::string arch;           // general.architecture; only "llama" is accepted
  int dim = 0;                // llama.embedding_length (576 for SmolLM-135M)
  int n_layers = 0;           // llama.block_count (30)
  int n_heads = 0;            // llama.attention.head_count (9)
  int n_kv_heads = 0;         // llama.attention.head_count_kv (3)
  int head_dim = 0;           // dim / n_heads (64)
  int hidden_dim = 0;         // llama.feed_forward_length (1536)
  int vocab_size = 0;         // rows of token_embd.weight (49152)
  int n_ctx_train = 0;        // llama.context_length (8192 for SmolLM2)
  int rope_dim = 0;           // llama.rope.dimension_count (default head_dim)
  float norm_eps = 1e-5f;     // llama.attention.layer_norm_rms_epsilon
  float rope_base = 10000.f;  // llama.rope.freq_base
  bool tied_output = false;   // output.weight absent -> lm_head is token_embd

  int kv_dim() const { return n_kv_heads * head_dim; }
  int q_dim() const { return n_heads * head_dim; }
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
};

struct Weights {
  TensorView token_embd;   // rows vocab_size, cols dim
  TensorView output_norm;  // [dim]
  TensorView output;       // rows vocab_size, cols dim (== token_embd when tied)
  std::vector<LayerWeights> layers;
};

struct Model {
  std::shared_ptr<gguf::File> file;
  LlamaConfig config;
  Weights weights;
};

// Reads and validates hyperparameters; throws Error naming the key (or the unsupported arch).
LlamaConfig load_config(const gguf::File& f);
// Maps tensor names to roles and checks every shape and type against the config; throws Error
// naming the tensor, its shape/type and the expected one.
Weights load_weights(const gguf::File& f, const LlamaConfig& c);
// open + load_config + load_weights.
Model load_model(const std::string& path);

}  // namespace smolrt
