#include "backend/cpu/cpu_forward.h"

#include <algorithm>
#include <fstream>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace smolrt::cpu {

namespace {

std::vector<float> norm_to_f32(const TensorView& t, int dim) {
  if (t.rows * t.cols != dim) {
    fail("norm tensor '", t.name, "' has ", t.rows * t.cols, " elements; expected dim = ", dim);
  }
  std::vector<float> v(dim);
  dequant_row(TensorView{t.name, t.type, 1, dim, t.data, t.nbytes}, 0, v.data());
  return v;
}

}  // namespace

Forward::Forward(const Model& m, int kv_tokens, int max_pos, int n_threads)
    : c_(m.config), w_(m.weights), file_(m.file), kv_tokens_(kv_tokens) {
  if (kv_tokens <= 0 || max_pos <= 0)
    fail("CPU forward: KV slots ", kv_tokens, " and positions ", max_pos, " must be positive");
  if (n_threads < 0)
    fail("--threads ", n_threads, " is invalid: use 0 (all cores) or a positive count");
  n_threads_ = n_threads > 0 ? n_threads : default_thread_count();
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
  att_.resize(max_pos);
  logits_.resize(c_.vocab_size);
  const size_t kv = size_t(c_.n_layers) * kv_tokens_ * kv_dim_;
  k_cache_.reset(new float[kv]);
  v_cache_.reset(new float[kv]);
}

std::string Forward::device_name() const {
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

void Forward::record(int layer, const char* what, const float* v, int n) {
  if (!debug_) return;
  acts_.push_back(Activation{layer >= 0 ? cat("blk.", layer, ".", what) : std::string(what),
                             std::vector<float>(v, v + n)});
}

std::span<const float> Forward::forward(int token, int pos, std::span<const int> pages,
                                        int page_size) {
  const int dim = c_.dim, hd = c_.head_dim;
  const size_t slot = size_t(pages[pos / page_size]) * page_size + pos % page_size;
  acts_.clear();

  embed(x_.data(), w_.token_embd, token);
  record(-1, "embed", x_.data(), dim);
  for (int l = 0; l < c_.n_layers; ++l) {
    const LayerWeights& lw = w_.layers[l];
    float* k_layer = k_cache_.get() + layer_offset(l);
    float* v_layer = v_cache_.get() + layer_offset(l);
    // --- attention
    rmsnorm(xb_.data(), x_.data(), attn_norm_[l].data(), dim, c_.norm_eps);
    record(l, "attn_norm", xb_.data(), dim);
    float* k = k_layer + slot * kv_dim_;
    float* v = v_layer + slot * kv_dim_;
    matvec(q_.data(), lw.wq, xb_.data(), n_threads_);
    matvec(k, lw.wk, xb_.data(), n_threads_);
    matvec(v, lw.wv, xb_.data(), n_threads_);
    rope(q_.data(), c_.n_heads, hd, c_.rope_dim, pos, c_.rope_base);
    rope(k, c_.n_kv_heads, hd, c_.rope_dim, pos, c_.rope_base);
    attention_paged(xb_.data(), q_.data(), k_layer, v_layer, pages.data(), page_size, pos + 1,
                    c_.n_heads, c_.n_kv_heads, hd, att_.data());
    matvec(xb2_.data(), lw.wo, xb_.data(), n_threads_);
    for (int i = 0; i < dim; ++i) x_[i] += xb2_[i];
    record(l, "attn_out", x_.data(), dim);
    // --- feed-forward (SwiGLU)
    rmsnorm(xb_.data(), x_.data(), ffn_norm_[l].data(), dim, c_.norm_eps);
    record(l, "ffn_norm", xb_.data(), dim);
    matvec(hb_.data(), lw.w_gate, xb_.data(), n_threads_);
    matvec(hb2_.data(), lw.w_up, xb_.data(), n_threads_);
    silu_mul(hb_.data(), hb_.data(), hb2_.data(), c_.hidden_dim);
    matvec(xb2_.data(), lw.w_down, hb_.data(), n_threads_);
    for (int i = 0; i < dim; ++i) x_[i] += xb2_[i];
    record(l, "ffn_out", x_.data(), dim);
  }
  rmsnorm(xb_.data(), x_.data(), out_norm_.data(), dim, c_.norm_eps);
  record(-1, "output_norm", xb_.data(), dim);
  matvec(logits_.data(), w_.output, xb_.data(), n_threads_);
  record(-1, "logits", logits_.data(), c_.vocab_size);
  return logits_;
}

}  // namespace smolrt::cpu
