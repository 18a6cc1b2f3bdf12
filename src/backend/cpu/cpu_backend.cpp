// CpuBackend: the fp32 oracle. Straight-line llama forward (llama2.c style) over weights that
// stay in the mmap (dequantized per block inside matvec); activations and an f32 KV cache of
// n_ctx positions are allocated once in the constructor, never inside a forward step.
#include <algorithm>
#include <cstring>
#include <fstream>

#include "backend/backend.h"
#include "backend/cpu/ops.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace smolrt {

namespace {

class CpuBackend final : public Backend {
 public:
  CpuBackend(const Model& m, const BackendOptions& opt);

  std::string name() const override { return "cpu"; }
  const LlamaConfig& config() const override { return c_; }
  int n_ctx() const override { return n_ctx_; }
  int position() const override { return pos_; }

  void reset() override { pos_ = 0; }
  void rollback(int pos) override;

  std::span<const float> forward_token(int token, int pos) override;
  std::span<const float> forward_prompt(std::span<const int> tokens) override;
  std::vector<float> forward_prompt_all(std::span<const int> tokens) override;

  std::vector<Activation> activations() const override { return acts_; }
  std::string device_name() const override;

 private:
  // Debug only: stores a copy of v as "blk.<layer>.<what>" (layer >= 0) or "<what>".
  void record(int layer, const char* what, const float* v, int n);
  float* k_at(int layer, int pos) {
    return k_cache_.get() + (size_t(layer) * n_ctx_ + pos) * kv_dim_;
  }
  float* v_at(int layer, int pos) {
    return v_cache_.get() + (size_t(layer) * n_ctx_ + pos) * kv_dim_;
  }

  LlamaConfig c_;
  Weights w_;
  std::shared_ptr<gguf::File> file_;  // keeps the mapping the views point into alive
  int n_ctx_ = 0;
  int n_threads_ = 1;
  int kv_dim_ = 0;
  int pos_ = 0;

  // Norm weights as f32 (any stored type), [dim] each.
  std::vector<std::vector<float>> attn_norm_, ffn_norm_;
  std::vector<float> out_norm_;

  // Activations for one token.
  std::vector<float> x_;       // [dim] residual stream
  std::vector<float> xb_;      // [max(dim, q_dim)] normed input / attention output
  std::vector<float> xb2_;     // [dim] projection output
  std::vector<float> q_;       // [q_dim]
  std::vector<float> hb_;      // [hidden_dim] gate, then silu(gate) * up
  std::vector<float> hb2_;     // [hidden_dim] up
  std::vector<float> att_;     // [n_ctx] attention scores
  std::vector<float> logits_;  // [vocab_size]
  // KV cache: [n_layers][n_ctx][kv_dim] each. Left uninitialized on purpose: positions are written
  // before they are read, and the OS commits pages only as positions get used, so a default
  // 8192-token context (377 MB for SmolLM2) costs memory only for what a session fills.
  std::unique_ptr<float[]> k_cache_, v_cache_;

  std::vector<Activation> acts_;
};

std::vector<float> norm_to_f32(const TensorView& t, int dim) {
  if (t.rows * t.cols != dim) {
    fail("norm tensor '", t.name, "' has ", t.rows * t.cols, " elements; expected dim = ", dim);
  }
  std::vector<float> v(dim);
  cpu::dequant_row(TensorView{t.name, t.type, 1, dim, t.data, t.nbytes}, 0, v.data());
  return v;
}

CpuBackend::CpuBackend(const Model& m, const BackendOptions& opt)
    : c_(m.config), w_(m.weights), file_(m.file) {
  if (opt.n_ctx < 0)
    fail("--ctx ", opt.n_ctx, " is invalid: it must be positive (0 = the model's ", c_.n_ctx_train,
         ")");
  n_ctx_ = opt.n_ctx > 0 ? opt.n_ctx : c_.n_ctx_train;
  if (c_.n_ctx_train > 0 && n_ctx_ > c_.n_ctx_train) {
    fail("--ctx ", n_ctx_, " exceeds the model's training context of ", c_.n_ctx_train,
         " tokens; use --ctx ", c_.n_ctx_train, " or less");
  }
  if (n_ctx_ <= 0) fail("the model declares no context length; pass --ctx N");
  if (opt.n_threads < 0)
    fail("--threads ", opt.n_threads, " is invalid: use 0 (all cores) or a positive count");
  n_threads_ = opt.n_threads > 0 ? opt.n_threads : default_thread_count();
  if (c_.n_heads <= 0 || c_.n_kv_heads <= 0 || c_.n_heads % c_.n_kv_heads != 0 ||
      c_.rope_dim > c_.head_dim || c_.rope_dim % 2 != 0 ||
      static_cast<int>(w_.layers.size()) != c_.n_layers) {
    fail("model config is inconsistent (n_heads ", c_.n_heads, ", n_kv_heads ", c_.n_kv_heads,
         ", head_dim ", c_.head_dim, ", rope_dim ", c_.rope_dim, ", layers ", w_.layers.size(), "/",
         c_.n_layers, ")");
  }
  kv_dim_ = c_.kv_dim();
  for (const LayerWeights& l : w_.layers) {
    attn_norm_.push_back(norm_to_f32(l.attn_norm, c_.dim));
    ffn_norm_.push_back(norm_to_f32(l.ffn_norm, c_.dim));
  }
  out_norm_ = norm_to_f32(w_.output_norm, c_.dim);

  x_.resize(c_.dim);
  xb_.resize(std::max(c_.dim, c_.q_dim()));
  xb2_.resize(c_.dim);
  q_.resize(c_.q_dim());
  hb_.resize(c_.hidden_dim);
  hb2_.resize(c_.hidden_dim);
  att_.resize(n_ctx_);
  logits_.resize(c_.vocab_size);
  const size_t kv = size_t(c_.n_layers) * n_ctx_ * kv_dim_;
  k_cache_.reset(new float[kv]);
  v_cache_.reset(new float[kv]);
}

std::string CpuBackend::device_name() const {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t c = line.find(':');
      if (c != std::string::npos && c + 2 <= line.size()) {
        return cat(line.substr(c + 2), " (", n_threads_, " threads)");
      }
    }
  }
  return cat("cpu (", n_threads_, " threads)");
}

void CpuBackend::rollback(int pos) {
  if (pos < 0 || pos > pos_) {
    fail("rollback to position ", pos, " is invalid: the KV cache holds ", pos_,
         " tokens (valid 0..", pos_, ")");
  }
  pos_ = pos;
}

void CpuBackend::record(int layer, const char* what, const float* v, int n) {
  if (!debug_) return;
  acts_.push_back(Activation{layer >= 0 ? cat("blk.", layer, ".", what) : std::string(what),
                             std::vector<float>(v, v + n)});
}

std::span<const float> CpuBackend::forward_token(int token, int pos) {
  check_token(token);
  check_pos(pos);
  const int dim = c_.dim, hd = c_.head_dim;
  acts_.clear();
  pos_ = pos;  // writing at pos drops everything after it

  cpu::embed(x_.data(), w_.token_embd, token);
  record(-1, "embed", x_.data(), dim);
  for (int l = 0; l < c_.n_layers; ++l) {
    const LayerWeights& lw = w_.layers[l];
    // --- attention
    cpu::rmsnorm(xb_.data(), x_.data(), attn_norm_[l].data(), dim, c_.norm_eps);
    record(l, "attn_norm", xb_.data(), dim);
    float* k = k_at(l, pos);
    float* v = v_at(l, pos);
    cpu::matvec(q_.data(), lw.wq, xb_.data(), n_threads_);
    cpu::matvec(k, lw.wk, xb_.data(), n_threads_);
    cpu::matvec(v, lw.wv, xb_.data(), n_threads_);
    cpu::rope(q_.data(), c_.n_heads, hd, c_.rope_dim, pos, c_.rope_base);
    cpu::rope(k, c_.n_kv_heads, hd, c_.rope_dim, pos, c_.rope_base);
    cpu::attention(xb_.data(), q_.data(), k_at(l, 0), v_at(l, 0), pos + 1, c_.n_heads,
                   c_.n_kv_heads, hd, att_.data());
    cpu::matvec(xb2_.data(), lw.wo, xb_.data(), n_threads_);
    for (int i = 0; i < dim; ++i) x_[i] += xb2_[i];
    record(l, "attn_out", x_.data(), dim);
    // --- feed-forward (SwiGLU)
    cpu::rmsnorm(xb_.data(), x_.data(), ffn_norm_[l].data(), dim, c_.norm_eps);
    record(l, "ffn_norm", xb_.data(), dim);
    cpu::matvec(hb_.data(), lw.w_gate, xb_.data(), n_threads_);
    cpu::matvec(hb2_.data(), lw.w_up, xb_.data(), n_threads_);
    cpu::silu_mul(hb_.data(), hb_.data(), hb2_.data(), c_.hidden_dim);
    cpu::matvec(xb2_.data(), lw.w_down, hb_.data(), n_threads_);
    for (int i = 0; i < dim; ++i) x_[i] += xb2_[i];
    record(l, "ffn_out", x_.data(), dim);
  }
  cpu::rmsnorm(xb_.data(), x_.data(), out_norm_.data(), dim, c_.norm_eps);
  record(-1, "output_norm", xb_.data(), dim);
  cpu::matvec(logits_.data(), w_.output, xb_.data(), n_threads_);
  record(-1, "logits", logits_.data(), c_.vocab_size);
  pos_ = pos + 1;
  return logits_;
}

std::span<const float> CpuBackend::forward_prompt(std::span<const int> tokens) {
  if (tokens.empty()) fail("forward_prompt needs at least one token");
  for (int t : tokens) check_token(t);
  if (pos_ + static_cast<int64_t>(tokens.size()) > n_ctx_) {
    fail("the prompt has ", tokens.size(), " tokens but only ", n_ctx_ - pos_, " of the ", n_ctx_,
         " context positions are free; use a larger --ctx or a shorter prompt");
  }
  std::span<const float> out;
  for (int t : tokens) out = forward_token(t, pos_);
  return out;
}

std::vector<float> CpuBackend::forward_prompt_all(std::span<const int> tokens) {
  if (tokens.empty()) fail("forward_prompt_all needs at least one token");
  for (int t : tokens) check_token(t);
  if (pos_ + static_cast<int64_t>(tokens.size()) > n_ctx_) {
    fail("the prompt has ", tokens.size(), " tokens but only ", n_ctx_ - pos_, " of the ", n_ctx_,
         " context positions are free; use a larger --ctx or a shorter prompt");
  }
  std::vector<float> all;
  all.reserve(tokens.size() * size_t(c_.vocab_size));
  for (int t : tokens) {
    std::span<const float> l = forward_token(t, pos_);
    all.insert(all.end(), l.begin(), l.end());
  }
  return all;
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const Model& m, const BackendOptions& opt) {
  return std::make_unique<CpuBackend>(m, opt);
}

}  // namespace smolrt
