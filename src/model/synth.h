// `smolrt synth`: GGUF files (llama, qwen2 or gemma3) with random weights and a real model's
// shapes, for speed work and tests without downloading anything. A preset writes every key and
// tensor its family needs (model/model.cpp's load_config reads them back): qwen2 the q/k/v
// biases (~N(0, 0.1)); gemma3 attention.key_length, the sliding window (and, for the tiny preset,
// a per-layer sliding_window_pattern), the per-head q/k norms and the post norms (~1 + N(0, 0.05),
// as GGUF stores gemma norms with the +1 folded in); llama3 presets the rope_freqs.weight factors
// computed as llama.cpp's converter does from (factor, low, high, original context).
//
// Weights: a counter-based hash (splitmix64 of seed, tensor name, element index) feeds an inverse
// normal CDF, so every element is independent of thread count and tensor order, and a seed always
// gives the same bytes (with the same libm). Matrices ~ N(0, 0.02) like a trained model's; norm
// weights ~ 1 + N(0, 0.05). Rows are generated and quantized directly into the output buffers.
// Tensor types follow plan_model (model/quantize_model.h) for the target (a type or a llama.cpp
// mixture such as q4_k_m): for q4_0 the layer matrices are Q4_0, token_embd is Q8_0 (tied: no
// output.weight), norms F32.
//
// Vocabulary: with a Hugging Face tokenizer.json, vocab_from_hf_json's tokens (the embedding has
// one row per token). Without one, builtin_byte_vocab(): a byte-level gpt2 vocab (3 control
// tokens <|endoftext|>=0 <|im_start|>=1 <|im_end|>=2, the 256 bytes in GPT-2's byte-to-unicode
// form at ids 3..258, a handful of merges), padded with unused "<|unused_N|>" tokens up to the
// preset's vocab size so the tensor rows and the vocab always match.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "model/quantize_model.h"
#include "quant/formats.h"
#include "tokenizer/tokenizer.h"

namespace smolrt {

struct SynthPreset {
  std::string name;  // "smollm-135m" | ... | "tiny" | "qwen2.5-0.5b" | "tiny-gemma3" | ...
  int dim;           // embedding_length
  int n_layers;      // block_count
  int n_heads;       // head_count
  int n_kv_heads;    // head_count_kv
  int hidden_dim;    // feed_forward_length
  int vocab_size;    // rows of token_embd; 0 = the built-in byte vocab's own size
  int n_ctx;         // context_length
  float rope_base;   // rope.freq_base
  float norm_eps;    // layer_norm_rms_epsilon
  std::string arch = "llama";  // general.architecture: "llama" | "qwen2" | "gemma3"
  int head_dim = 0;            // attention.key_length; 0 = dim / n_heads (key not written)
  bool tied = true;            // false: an output.weight is written
  // llama3 RoPE scaling (rope_freqs.weight); rope_factor 0 = none.
  float rope_factor = 0.f, rope_low = 1.f, rope_high = 4.f;
  int rope_orig_ctx = 8192;
  // gemma3: attention.sliding_window; swa_pattern non-empty: written as
  // attention.sliding_window_pattern (one bool per layer), else the default period 6 applies.
  int sliding_window = 0;
  std::vector<uint8_t> swa_pattern = {};

  int hd() const { return head_dim ? head_dim : dim / n_heads; }
};

// llama.cpp convert_hf_to_gguf.py's llama3 frequency factors for rope_dim and base, [rope_dim/2].
std::vector<float> llama3_rope_factors(const SynthPreset& p, int rope_dim);

// The preset by name; Error listing the known names otherwise.
const SynthPreset& synth_preset(const std::string& name);
const std::vector<SynthPreset>& synth_presets();

// The tensors of a preset's model with n_vocab embedding rows, in file order (shapes only).
std::vector<TensorShape> synth_tensors(const SynthPreset& p, int n_vocab);

// The built-in byte-level vocab, padded with unused tokens to `pad_to` entries when larger.
VocabData builtin_byte_vocab(int pad_to = 0);

struct SynthOptions {
  std::string preset = "tiny";
  std::string tokenizer_json;         // "" = built-in byte vocab
  QuantTarget type = GgmlType::Q4_0;  // any `smolrt quantize --type` value (or a GgmlType)
  uint64_t seed = 42;
};

// The generated model. `writer` points into `buffers`: keep this alive until write() returns.
struct SynthModel {
  gguf::Writer writer;
  std::vector<std::vector<uint8_t>> buffers;
  uint64_t n_tensors = 0;
  uint64_t n_params = 0;
  uint64_t tensor_bytes = 0;  // sum of tensor data sizes (no alignment padding)
  int vocab_size = 0;
};

SynthModel synth_model(const SynthOptions& o);

}  // namespace smolrt
