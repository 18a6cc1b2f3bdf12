// The forward pass (llama2.c style) of every family model.h's block describes, shared by the
// single-sequence CpuBackend and the CPU BatchBackend and by both kernel sets (kernels.h): the
// fp32 oracle (weights stay in the mmap, dequantized per block inside matmul) and the fast path
// (int8 activations, repacked weights, SIMD). Norms as f32; activations for max_rows tokens and a
// KV pool (f32) are allocated once here, never inside a forward step. The caller decides where
// positions live: a sequence's KV rows are pages of page_size pool slots listed by its block table
// (the single-sequence backend uses one page of its whole context).
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "model/model.h"

namespace smolrt::cpu {

// Which kernels a Forward runs: the fp32 oracle, or the fast path at a SIMD level.
struct KernelChoice {
  bool fast = false;
  Isa isa = Isa::Scalar;
};

// The choice a backend kind names: "cpu-ref" the oracle, anything else the fast path at
// choose_isa()'s level (SMOLRT_CPU_ISA or the best this CPU runs).
KernelChoice kernel_choice(const std::string& kind);

class Forward {
 public:
  // kv_tokens: pool slots per layer; max_pos: positions one sequence may hold (attention scratch);
  // max_rows: tokens one forward() may carry; n_threads: 0 = the default (physical cores). Throws
  // Error for an inconsistent model, bad counts or a weight type the kernels cannot compute.
  Forward(const Model& m, int kv_tokens, int max_pos, int max_rows, int n_threads,
          KernelChoice kernels);

  const ModelConfig& config() const { return c_; }
  int n_threads() const { return n_threads_; }
  bool fast() const { return fast_; }
  // The CPU's model name, the thread count and, on the fast path, the kernels' level.
  std::string device_name() const;

  // One token of a forward(): `token` (a valid id) at position pos (< max_pos) of a sequence
  // whose positions 0..pos live in the pool at slot(t) = pages[t / page_size] * page_size +
  // t % page_size (pages covers pos); logits: whether the caller wants its logits.
  struct Row {
    int token = 0;
    int pos = 0;
    std::span<const int> pages;
    bool logits = false;
  };
  using LogitsFn = std::function<void(int row, std::span<const float> logits)>;
  // Runs rows through the model together, layer by layer, so each weight row is read once for
  // all of them: writes every row's K/V, then each row attends to its positions 0..pos (rows of
  // one sequence in position order see each other). Then calls on_logits in row order for the
  // rows that want logits (a span is valid during its call; the last one's until the next
  // forward(), which is how a one-row caller returns it). Each row's arithmetic
  // is exactly that of running it alone: results never depend on what else is in the call.
  void forward(std::span<const Row> rows, int page_size, const LogitsFn& on_logits);

  // K/V rows [src, src + n) of the pool copied to [dst, dst + n) in every layer (a KV page's
  // copy-on-write, kv_pages.h).
  void copy_kv(int src, int dst, int n);

  // Debug: when on, forward() records named per-layer activations of its last row.
  void set_debug(bool on) { debug_ = on; }
  const std::vector<Activation>& activations() const { return acts_; }

 private:
  // Debug only: stores a copy of v as "blk.<layer>.<what>" (layer >= 0) or "<what>".
  void record(int layer, const char* what, const float* v, int n);
  size_t layer_offset(int layer) const { return size_t(layer) * kv_tokens_ * kv_dim_; }

  ModelConfig c_;
  Weights w_;
  std::shared_ptr<gguf::File> file_;  // keeps the mapping the views point into alive
  int kv_tokens_ = 0;
  int n_threads_ = 1;
  int kv_dim_ = 0;
  bool debug_ = false;
  bool fast_ = false;

  std::unique_ptr<Kernels> kern_;
  // The matrices as the kernels prepared them: per layer, and the output head.
  struct LayerIds {
    WeightId wq, wk, wv, wo, gate, up, down;
  };
  std::vector<LayerIds> ids_;
  WeightId out_id_ = -1;

  // Norm weights as f32 (any stored type), [dim] each; the optional ones (model.h's switches)
  // empty when the config does not use them: q/k norms [head_dim], biases [q_dim] / [kv_dim].
  std::vector<std::vector<float>> attn_norm_, ffn_norm_;
  std::vector<std::vector<float>> post_attn_norm_, post_ffn_norm_, q_norm_, k_norm_;
  std::vector<std::vector<float>> bq_, bk_, bv_;
  std::vector<float> out_norm_;

  // Activations, [max_rows][...] each (row-major, one row per token).
  int max_rows_ = 1;
  std::vector<float> x_;           // [dim] residual stream
  std::vector<float> xb_;          // [dim] normed input
  std::vector<float> att_out_;     // [q_dim] attention output
  std::vector<float> xb2_;         // [dim] projection output
  std::vector<float> q_;           // [q_dim]
  std::vector<float> k_, v_;       // [kv_dim] this step's K/V rows before they go to the pool
  std::vector<float> hb_;          // [hidden_dim] gate, then silu(gate) * up
  std::vector<float> hb2_;         // [hidden_dim] up
  std::vector<AttnRow> att_rows_;  // [max_rows] this layer's attention rows
  std::vector<float> rope_cs_;     // [max_rows][2][rope_dim] RoPE cos/sin: global, local base
  // The output matmul runs over groups of kLogitRows rows that want logits (a step may ask for
  // hundreds of rows; their logits need not be held at once).
  static constexpr int kLogitRows = 8;
  std::vector<float> xo_;      // [kLogitRows][dim] final-normed rows
  std::vector<float> logits_;  // [kLogitRows][vocab_size]
  // KV pool: [n_layers][kv_tokens][kv_dim] each. Left uninitialized on purpose: a slot is written
  // before it is read, and the OS commits pages only as slots get used, so a default 8192-token
  // context (377 MB for SmolLM2) or a large multi-sequence pool costs memory only for what is
  // filled.
  std::unique_ptr<float[]> k_cache_, v_cache_;

  std::vector<Activation> acts_;
};

}  // namespace smolrt::cpu
