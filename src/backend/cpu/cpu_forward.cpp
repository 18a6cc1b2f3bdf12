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
  dequantize(TensorView{t.name, t.type, 1, dim, t.data, t.nbytes}, 0, v.data());
  return v;
}

}  // namespace

KernelChoice kernel_choice(const std::string& kind) {
  if (kind == "cpu-ref") return KernelChoice{false, Isa::Scalar};
  if (kind == "cpu" || kind == "auto") return KernelChoice{true, choose_isa()};
  fail("internal: '", kind, "' is not a CPU backend kind (cpu, cpu-ref or auto)");
}

Forward::Forward(const Model& m, int kv_tokens, int max_pos, int max_rows, int n_threads,
                 KernelChoice kernels)
    : c_(m.config),
      w_(m.weights),
      file_(m.file),
      kv_tokens_(kv_tokens),
      fast_(kernels.fast),
      max_rows_(max_rows) {
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
  const int64_t max_cols = std::max({c_.dim, c_.q_dim(), c_.hidden_dim});
  kern_ = kernels.fast ? make_fast_kernels(n_threads_, kernels.isa, std::max(max_rows, kLogitRows),
                                           max_cols, max_pos)
                       : make_ref_kernels(n_threads_, max_pos);
  for (const LayerWeights& l : w_.layers) {
    ids_.push_back(LayerIds{kern_->add(l.wq), kern_->add(l.wk), kern_->add(l.wv), kern_->add(l.wo),
                            kern_->add(l.w_gate), kern_->add(l.w_up), kern_->add(l.w_down)});
  }
  out_id_ = kern_->add(w_.output);

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
  att_rows_.resize(rows);
  rope_cs_.resize(rows * 2 * size_t(c_.rope_dim));
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
        return cat(line.substr(c + 2), " (", n_threads_, " threads, ", kern_->name(), ")");
      }
    }
  }
  return cat("cpu (", n_threads_, " threads, ", kern_->name(), ")");
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
  // Each row's RoPE angles, once per step for all layers: [row][local?][rope_dim] (cos, sin pairs).
  const float* freq_factors = c_.rope_freq_factors.empty() ? nullptr : c_.rope_freq_factors.data();
  const int rd = c_.rope_dim;
  for (int j = 0; j < n; ++j) {
    rope_angles(&rope_cs_[size_t(2 * j) * rd], rd, rows[j].pos, c_.rope_base, freq_factors);
    if (!c_.swa_layers.empty())
      rope_angles(&rope_cs_[size_t(2 * j + 1) * rd], rd, rows[j].pos, c_.rope_base_swa,
                  freq_factors);
  }
  QkvFinishShape fin;
  fin.n_heads = c_.n_heads, fin.n_kv_heads = c_.n_kv_heads, fin.head_dim = hd, fin.rope_dim = rd;
  fin.neox = c_.rope_neox, fin.eps = c_.norm_eps;
  for (int l = 0; l < c_.n_layers; ++l) {
    const LayerIds& id = ids_[size_t(l)];
    float* k_layer = k_cache_.get() + layer_offset(l);
    float* v_layer = v_cache_.get() + layer_offset(l);
    const size_t local = c_.is_swa(l) ? 1 : 0;  // which angles: layer_rope_base(l)
    // --- attention
    for (int j = 0; j < n; ++j)
      rmsnorm(&xb_[size_t(j) * dim], &x_[size_t(j) * dim], attn_norm_[l].data(), dim, c_.norm_eps);
    record(l, "attn_norm", &xb_[size_t(last) * dim], dim);
    const MatTarget qkv[] = {{id.wq, q_.data()}, {id.wk, k_.data()}, {id.wv, v_.data()}};
    kern_->matmul(xb_.data(), n, qkv);
    // Every row's K/V goes to the pool before any row attends, so a sequence's later rows in
    // this step see its earlier ones.
    for (int j = 0; j < n; ++j) {
      float* q = &q_[size_t(j) * q_dim];
      float* k = &k_[size_t(j) * kv_dim_];
      float* v = &v_[size_t(j) * kv_dim_];
      qkv_finish(q, k, v, fin, c_.attn_bias ? bq_[l].data() : nullptr,
                 c_.attn_bias ? bk_[l].data() : nullptr, c_.attn_bias ? bv_[l].data() : nullptr,
                 c_.qk_norm ? q_norm_[l].data() : nullptr, c_.qk_norm ? k_norm_[l].data() : nullptr,
                 &rope_cs_[(size_t(2 * j) + local) * rd]);
      const size_t s = slot(rows[j]) * kv_dim_;
      std::copy_n(k, kv_dim_, k_layer + s);
      std::copy_n(v, kv_dim_, v_layer + s);
    }
    for (int j = 0; j < n; ++j) {
      att_rows_[size_t(j)] =
          AttnRow{rows[j].pages.data(), c_.first_key(l, rows[j].pos), rows[j].pos + 1};
    }
    kern_->attention(att_out_.data(), q_.data(), k_layer, v_layer, {att_rows_.data(), size_t(n)},
                     AttnShape{c_.n_heads, c_.n_kv_heads, hd, page_size, c_.attn_scale});
    const MatTarget o[] = {{id.wo, xb2_.data()}};
    kern_->matmul(att_out_.data(), n, o);
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
    const MatTarget gate_up[] = {{id.gate, hb_.data()}, {id.up, hb2_.data()}};
    kern_->matmul(xb_.data(), n, gate_up);
    kern_->gated_act(c_.act, hb_.data(), hb2_.data(), int64_t(n) * hidden);
    const MatTarget down[] = {{id.down, xb2_.data()}};
    kern_->matmul(hb_.data(), n, down);
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
    const MatTarget head[] = {{out_id_, logits_.data()}};
    kern_->matmul(xo_.data(), g, head);
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
