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
    fail("norm tensor '", t.name, "' has ", t.rows * t.cols, " elements; expected ", dim);
  }
  std::vector<float> v(dim);
  dequant_row(TensorView{t.name, t.type, 1, dim, t.data, t.nbytes}, 0, v.data());
  return v;
}

}  // namespace

Forward::Forward(const Model& m, int kv_tokens, int max_pos, int max_rows, int n_threads)
    : c_(m.config), w_(m.weights), file_(m.file), kv_tokens_(kv_tokens), max_rows_(max_rows) {
  if (kv_tokens <= 0 || max_pos <= 0 || max_rows <= 0)
    fail("CPU forward: KV slots ", kv_tokens, ", positions ", max_pos, " and rows ", max_rows,
         " must be positive");
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
  if (c_.sliding_window < 0 ||
      (!c_.swa_layers.empty() && c_.swa_layers.size() != static_cast<size_t>(c_.n_layers)) ||
      (!c_.rope_freq_factors.empty() &&
       c_.rope_freq_factors.size() != static_cast<size_t>(c_.rope_dim / 2))) {
    fail("model config is inconsistent (sliding window ", c_.sliding_window, ", ",
         c_.swa_layers.size(), " layer flags, ", c_.rope_freq_factors.size(),
         " rope frequency factors)");
  }
  for (const LayerWeights& l : w_.layers) {
    attn_norm_.push_back(norm_to_f32(l.attn_norm, c_.dim));
    ffn_norm_.push_back(norm_to_f32(l.ffn_norm, c_.dim));
    if (c_.post_norms) {
      post_attn_norm_.push_back(norm_to_f32(l.post_attn_norm, c_.dim));
      post_ffn_norm_.push_back(norm_to_f32(l.post_ffn_norm, c_.dim));
    }
    if (c_.qk_norm) {
      q_norm_.push_back(norm_to_f32(l.q_norm, c_.head_dim));
      k_norm_.push_back(norm_to_f32(l.k_norm, c_.head_dim));
    }
    if (c_.attn_bias) {
      bq_.push_back(norm_to_f32(l.bq, c_.q_dim()));
      bk_.push_back(norm_to_f32(l.bk, c_.kv_dim()));
      bv_.push_back(norm_to_f32(l.bv, c_.kv_dim()));
    }
  }
  out_norm_ = norm_to_f32(w_.output_norm, c_.dim);

  const size_t rows = max_rows;
  x_.resize(rows * c_.dim);
  xb_.resize(rows * c_.dim);
  att_out_.resize(rows * c_.q_dim());
  xb2_.resize(rows * c_.dim);
  q_.resize(rows * c_.q_dim());
  k_.resize(rows * kv_dim_);
  v_.resize(rows * kv_dim_);
  hb_.resize(rows * c_.hidden_dim);
  hb2_.resize(rows * c_.hidden_dim);
  att_.resize(max_pos);
  xo_.resize(size_t(kLogitRows) * c_.dim);
  logits_.resize(size_t(kLogitRows) * c_.vocab_size);
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

void Forward::forward(std::span<const Row> rows, int page_size, const LogitsFn& on_logits) {
  const int n = static_cast<int>(rows.size());
  const int dim = c_.dim, hd = c_.head_dim, q_dim = c_.q_dim(), hidden = c_.hidden_dim;
  if (n == 0) return;
  if (n > max_rows_) fail("internal: a CPU forward of ", n, " rows; at most ", max_rows_);
  acts_.clear();
  const int last = n - 1;  // the row debug records follow
  auto slot = [&](const Row& r) {
    return size_t(r.pages[r.pos / page_size]) * page_size + r.pos % page_size;
  };

  for (int j = 0; j < n; ++j) {
    float* x = &x_[size_t(j) * dim];
    embed(x, w_.token_embd, rows[j].token);
    if (c_.embed_scale != 1.f) {
      for (int i = 0; i < dim; ++i) x[i] *= c_.embed_scale;
    }
  }
  record(-1, "embed", &x_[size_t(last) * dim], dim);
  const float* freq_factors = c_.rope_freq_factors.empty() ? nullptr : c_.rope_freq_factors.data();
  auto add_bias = [n](float* y, const std::vector<float>& b) {
    const size_t m = b.size();
    for (int j = 0; j < n; ++j) {
      for (size_t i = 0; i < m; ++i) y[size_t(j) * m + i] += b[i];
    }
  };
  for (int l = 0; l < c_.n_layers; ++l) {
    const LayerWeights& lw = w_.layers[l];
    float* k_layer = k_cache_.get() + layer_offset(l);
    float* v_layer = v_cache_.get() + layer_offset(l);
    const float base = c_.layer_rope_base(l);
    // --- attention
    for (int j = 0; j < n; ++j)
      rmsnorm(&xb_[size_t(j) * dim], &x_[size_t(j) * dim], attn_norm_[l].data(), dim, c_.norm_eps);
    record(l, "attn_norm", &xb_[size_t(last) * dim], dim);
    matmul(q_.data(), lw.wq, xb_.data(), n, n_threads_);
    matmul(k_.data(), lw.wk, xb_.data(), n, n_threads_);
    matmul(v_.data(), lw.wv, xb_.data(), n, n_threads_);
    if (c_.attn_bias) {
      add_bias(q_.data(), bq_[l]);
      add_bias(k_.data(), bk_[l]);
      add_bias(v_.data(), bv_[l]);
    }
    // Every row's K/V goes to the pool before any row attends, so a sequence's later rows in
    // this step see its earlier ones.
    for (int j = 0; j < n; ++j) {
      float* q = &q_[size_t(j) * q_dim];
      float* k = &k_[size_t(j) * kv_dim_];
      if (c_.qk_norm) {
        head_rmsnorm(q, c_.n_heads, hd, q_norm_[l].data(), c_.norm_eps);
        head_rmsnorm(k, c_.n_kv_heads, hd, k_norm_[l].data(), c_.norm_eps);
      }
      rope_ext(q, c_.n_heads, hd, c_.rope_dim, rows[j].pos, base, c_.rope_neox, freq_factors);
      rope_ext(k, c_.n_kv_heads, hd, c_.rope_dim, rows[j].pos, base, c_.rope_neox, freq_factors);
      const size_t s = slot(rows[j]) * kv_dim_;
      std::copy_n(k, kv_dim_, k_layer + s);
      std::copy_n(&v_[size_t(j) * kv_dim_], kv_dim_, v_layer + s);
    }
    for (int j = 0; j < n; ++j) {
      attention_paged(&att_out_[size_t(j) * q_dim], &q_[size_t(j) * q_dim], k_layer, v_layer,
                      rows[j].pages.data(), page_size, rows[j].pos + 1, c_.n_heads, c_.n_kv_heads,
                      hd, att_.data(), c_.first_key(l, rows[j].pos), c_.attn_scale);
    }
    matmul(xb2_.data(), lw.wo, att_out_.data(), n, n_threads_);
    if (c_.post_norms) {
      for (int j = 0; j < n; ++j) {
        float* y = &xb2_[size_t(j) * dim];
        rmsnorm(y, y, post_attn_norm_[l].data(), dim, c_.norm_eps);
      }
    }
    for (size_t i = 0; i < size_t(n) * dim; ++i) x_[i] += xb2_[i];
    record(l, "attn_out", &x_[size_t(last) * dim], dim);
    // --- feed-forward (gated: SwiGLU or GELU(tanh))
    for (int j = 0; j < n; ++j)
      rmsnorm(&xb_[size_t(j) * dim], &x_[size_t(j) * dim], ffn_norm_[l].data(), dim, c_.norm_eps);
    record(l, "ffn_norm", &xb_[size_t(last) * dim], dim);
    matmul(hb_.data(), lw.w_gate, xb_.data(), n, n_threads_);
    matmul(hb2_.data(), lw.w_up, xb_.data(), n, n_threads_);
    if (c_.act == FfnAct::GeluTanh) {
      gelu_tanh_mul(hb_.data(), hb_.data(), hb2_.data(), n * hidden);
    } else {
      silu_mul(hb_.data(), hb_.data(), hb2_.data(), n * hidden);
    }
    matmul(xb2_.data(), lw.w_down, hb_.data(), n, n_threads_);
    if (c_.post_norms) {
      for (int j = 0; j < n; ++j) {
        float* y = &xb2_[size_t(j) * dim];
        rmsnorm(y, y, post_ffn_norm_[l].data(), dim, c_.norm_eps);
      }
    }
    for (size_t i = 0; i < size_t(n) * dim; ++i) x_[i] += xb2_[i];
    record(l, "ffn_out", &x_[size_t(last) * dim], dim);
  }

  // --- logits, for the rows that want them, kLogitRows at a time
  const int vocab = c_.vocab_size;
  int group[kLogitRows];
  int g = 0;
  auto flush = [&] {
    matmul(logits_.data(), w_.output, xo_.data(), g, n_threads_);
    for (int i = 0; i < g; ++i) {
      const float* li = &logits_[size_t(i) * vocab];
      if (group[i] == last) {
        record(-1, "output_norm", &xo_[size_t(i) * dim], dim);
        record(-1, "logits", li, vocab);
      }
      on_logits(group[i], std::span<const float>(li, vocab));
    }
    g = 0;
  };
  for (int j = 0; j < n; ++j) {
    if (!rows[j].logits) continue;
    rmsnorm(&xo_[size_t(g) * dim], &x_[size_t(j) * dim], out_norm_.data(), dim, c_.norm_eps);
    group[g++] = j;
    if (g == kLogitRows) flush();
  }
  if (g > 0) flush();
}

void Forward::copy_kv(int src, int dst, int n) {
  if (src < 0 || dst < 0 || n < 0 || src + n > kv_tokens_ || dst + n > kv_tokens_)
    fail("copy_kv: rows [", src, ", ", src + n, ") -> [", dst, ", ", dst + n,
         ") are outside the pool of ", kv_tokens_);
  const size_t row = static_cast<size_t>(kv_dim_), count = row * n;
  for (int l = 0; l < c_.n_layers; ++l)
    for (float* cache : {k_cache_.get(), v_cache_.get()})
      std::copy_n(cache + layer_offset(l) + src * row, count, cache + layer_offset(l) + dst * row);
}

}  // namespace smolrt::cpu
