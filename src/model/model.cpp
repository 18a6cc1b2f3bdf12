// ModelConfig from GGUF metadata and Weights (typed views by role), with every shape and type
// checked against the config.
#include "model/model.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace smolrt {

namespace {

// Upper bounds that keep a hostile file from making us allocate absurd per-layer tables. They are
// far above any model smolrt targets (SmolLM-135M: 30 layers, dim 576).
constexpr uint64_t kMaxLayers = 1024;
constexpr uint64_t kMaxDim = uint64_t{1} << 20;

int get_dim(const gguf::File& f, const std::string& key, uint64_t max) {
  const uint64_t v = f.get_uint(key);
  if (v == 0 || v > max) {
    fail(f.path(), ": metadata '", key, "' is ", v, "; expected a value between 1 and ", max);
  }
  return static_cast<int>(v);
}

std::string shape_str(const gguf::TensorInfo& t) {
  std::string s = "[";
  for (uint32_t d = 0; d < t.n_dims; ++d) s += cat(d ? ", " : "", t.ne[d]);
  return s + "]";
}

// The view of tensor `name`, which must be a matrix [cols, rows] (or, with rows == 0, a vector of
// `cols` F32 values). `what` spells the expected shape in config words, e.g. "dim x kv_dim".
TensorView view(const gguf::File& f, const std::string& arch, const std::string& name, int64_t cols,
                int64_t rows, const char* what) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (!t) {
    fail(f.path(), ": tensor '", name, "' is missing; the file is incomplete or not a ", arch,
         " model (general.architecture says ", arch, ")");
  }
  const bool vec = rows == 0;
  const bool ok = vec ? (t->n_dims == 1 && t->ne[0] == static_cast<uint64_t>(cols))
                      : (t->n_dims == 2 && t->ne[0] == static_cast<uint64_t>(cols) &&
                         t->ne[1] == static_cast<uint64_t>(rows));
  if (!ok) {
    const std::string expected = vec ? cat("[", cols, "]") : cat("[", cols, ", ", rows, "]");
    fail(f.path(), ": ", name, " has shape ", shape_str(*t), ", expected ", expected, " (", what,
         ")");
  }
  const TypeInfo* ti = type_info(t->type);
  if (!ti->computable) {
    fail(f.path(), ": tensor '", name, "' has type ", ti->name,
         ", which smolrt cannot compute; requantize the model (`smolrt quantize --type q4_k_m`, "
         "or q4_0, q5_0, q6_k, q8_0, f16, ...)");
  }
  if (vec && t->type != GgmlType::F32) {
    fail(f.path(), ": ", name.find("bias") != std::string::npos ? "bias" : "norm", " tensor '",
         name, "' has type ", ti->name,
         "; norm and bias weights must be f32 (re-convert the model)");
  }
  TensorView v;
  v.name = name;
  v.type = t->type;
  v.cols = cols;
  v.rows = vec ? 1 : rows;
  v.data = t->data;
  v.nbytes = static_cast<size_t>(t->nbytes);
  return v;
}

}  // namespace

// --- config
// ---------------------------------------------------------------------------------------

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::Llama:
      return "llama";
    case Arch::Qwen2:
      return "qwen2";
    case Arch::Gemma3:
      return "gemma3";
  }
  return "?";
}

// Where each family's facts come from (checked against the public sources, 2026-11; read, never
// copied):
//
// llama (SmolLM2, Llama 3.x) — llama.cpp src/llama-model.cpp (LLM_ARCH_LLAMA, rope type NORM:
//   rotate adjacent pairs), convert_hf_to_gguf.py LlamaModel: keys llama.*; head_dim from
//   llama.attention.key_length when present (else dim / n_heads); Llama 3.1/3.2's "llama3" RoPE
//   scaling is not a key but the tensor rope_freqs.weight [rope_dim/2] f32 (the converter's
//   generate_extra_tensors: factor 1 for wavelengths < original_ctx/high_freq_factor, `factor`
//   above original_ctx/low_freq_factor, a smooth blend between), applied by ggml_rope_ext as
//   theta_i = pos * base^(-2i/rope_dim) / factor_i; output.weight absent -> tied to token_embd.
// qwen2 (Qwen2.5) — llama.cpp LLM_ARCH_QWEN2 (rope type NEOX, bq/bk/bv required), HF
//   transformers modeling_qwen2.py (q/k/v_proj bias=True, o_proj no bias, rotate_half = NeoX
//   pairs (i, i + d/2)): keys qwen2.*, rope base qwen2.rope.freq_base.
// gemma3 — llama.cpp LLM_ARCH_GEMMA3 (hparams: swa_type standard, set_swa_pattern(6): layer l is
//   local iff l % 6 < 5; rope_freq_base_train_swa = 10000; n_swa from
//   gemma3.attention.sliding_window, and llama-kv-cache's is_masked_swa (standard) hides key p0
//   from query p1 when p1 - p0 >= n_swa: a query sees itself and the n_swa - 1 keys before it,
//   which is ModelConfig::first_key; f_attention_scale = 1/sqrt(n_embd_head_k), 1/sqrt(dim /
//   n_heads) for the 27B; graph: inp * sqrt(n_embd), attn_q_norm / attn_k_norm per head before
//   RoPE NEOX, post_attention_norm and post_ffw_norm, GELU-gated FFN (ggml_gelu: tanh form)),
//   HF modeling_gemma3.py (query_pre_attn_scalar ** -0.5, rope_local_base_freq 10000,
//   sliding_window_pattern 6, Gemma3RMSNorm multiplies by (1 + w)), convert_hf_to_gguf.py
//   Gemma3Model (norm_shift = 1: every *norm.weight is stored with the +1 already added, so the
//   engine's plain rmsnorm(x) * w is right; writes key_length/value_length = head_dim (256),
//   layer_norm_rms_epsilon default 1e-6, sliding_window; tied embedding).
ModelConfig load_config(const gguf::File& f) {
  ModelConfig c;
  if (!f.has("general.architecture")) {
    fail(f.path(),
         ": metadata 'general.architecture' is missing; this GGUF holds no model "
         "(a vocab-only file?); smolrt needs a llama, qwen2 or gemma3 model");
  }
  c.arch = f.get_string("general.architecture");
  if (c.arch == "llama") {
    c.family = Arch::Llama;
  } else if (c.arch == "qwen2") {
    c.family = Arch::Qwen2;
  } else if (c.arch == "gemma3") {
    c.family = Arch::Gemma3;
  } else {
    fail(f.path(), ": architecture '", c.arch,
         "' is not supported; smolrt runs the llama, qwen2 and gemma3 architectures "
         "(general.architecture)");
  }
  const std::string p = c.arch + ".";
  const auto k = [&p](const char* key) { return p + key; };
  c.dim = get_dim(f, k("embedding_length"), kMaxDim);
  c.n_layers = get_dim(f, k("block_count"), kMaxLayers);
  c.hidden_dim = get_dim(f, k("feed_forward_length"), kMaxDim);
  c.n_heads = get_dim(f, k("attention.head_count"), kMaxDim);
  c.n_kv_heads = f.has(k("attention.head_count_kv"))
                     ? get_dim(f, k("attention.head_count_kv"), kMaxDim)
                     : c.n_heads;
  c.n_ctx_train = get_dim(f, k("context_length"), uint64_t{1} << 24);
  if (c.n_heads % c.n_kv_heads != 0) {
    fail(f.path(), ": ", k("attention.head_count"), " ", c.n_heads, " is not a multiple of ",
         k("attention.head_count_kv"), " ", c.n_kv_heads);
  }
  // head_dim: attention.key_length when the file has it (gemma3: 256 while dim / n_heads = 160),
  // else dim / n_heads (llama.cpp's n_embd_head_k default).
  if (f.has(k("attention.key_length"))) {
    c.head_dim = get_dim(f, k("attention.key_length"), 4096);
  } else {
    if (c.dim % c.n_heads != 0) {
      fail(f.path(), ": ", k("embedding_length"), " ", c.dim, " is not divisible by ",
           k("attention.head_count"), " ", c.n_heads, " and ", k("attention.key_length"),
           " is absent; the file must give the head size");
    }
    c.head_dim = c.dim / c.n_heads;
  }
  if (f.has(k("attention.value_length")) &&
      f.get_uint(k("attention.value_length")) != static_cast<uint64_t>(c.head_dim)) {
    fail(f.path(), ": ", k("attention.value_length"), " ", f.get_uint(k("attention.value_length")),
         " differs from the head size ", c.head_dim,
         "; smolrt needs equal key and value head sizes");
  }
  c.rope_dim = f.has(k("rope.dimension_count")) ? get_dim(f, k("rope.dimension_count"), kMaxDim)
                                                : c.head_dim;
  if (c.rope_dim > c.head_dim || c.rope_dim % 2 != 0) {
    fail(f.path(), ": ", k("rope.dimension_count"), " ", c.rope_dim,
         " must be even and at most head_dim ", c.head_dim);
  }
  const double base = f.get_float(k("rope.freq_base"), 10000.0);
  if (!(base > 0.0) || !std::isfinite(base) || base > 1e12) {
    fail(f.path(), ": ", k("rope.freq_base"), " ", base, " must be a positive finite number");
  }
  c.rope_base = static_cast<float>(base);
  const double eps = f.get_float(k("attention.layer_norm_rms_epsilon"));
  if (!(eps > 0.0) || !(eps < 1.0)) {
    fail(f.path(), ": ", k("attention.layer_norm_rms_epsilon"), " ", eps,
         " must be in (0, 1) (typically 1e-5 or 1e-6)");
  }
  c.norm_eps = static_cast<float>(eps);

  // RoPE scaling: none, linear with factor 1 (what some converters write for "no scaling"), or
  // llama3 (the factors are the rope_freqs.weight tensor). llama.cpp reads a factor of 0 as 1.
  const std::string scaling = f.get_string(k("rope.scaling.type"), "none");
  const double factor = f.get_float(k("rope.scaling.factor"), 0.0);
  const bool unit = factor == 0.0 || factor == 1.0;
  if (!(scaling == "none" && unit) && !(scaling == "linear" && unit) && scaling != "llama3") {
    fail(f.path(), ": ", k("rope.scaling.type"), " '", scaling, "' with ", k("rope.scaling.factor"),
         " ", factor,
         " is not supported; smolrt supports no RoPE scaling (none, or linear with factor 1) and "
         "llama3 frequency factors (rope_freqs.weight); use a model without context extension");
  }
  if (const gguf::TensorInfo* rf = f.find_tensor("rope_freqs.weight")) {
    if (rf->type != GgmlType::F32 || rf->n_dims != 1 ||
        rf->ne[0] != static_cast<uint64_t>(c.rope_dim / 2)) {
      fail(f.path(), ": rope_freqs.weight has shape ", shape_str(*rf), " and type ",
           type_info(rf->type)->name, ", expected [", c.rope_dim / 2,
           "] (rope_dim / 2) f32; re-convert the model");
    }
    c.rope_freq_factors.resize(static_cast<size_t>(c.rope_dim / 2));
    std::memcpy(c.rope_freq_factors.data(), rf->data, c.rope_freq_factors.size() * sizeof(float));
    for (size_t i = 0; i < c.rope_freq_factors.size(); ++i) {
      const float x = c.rope_freq_factors[i];
      if (!(x > 0.0f) || !std::isfinite(x)) {
        fail(f.path(), ": rope_freqs.weight[", i, "] is ", x,
             "; frequency factors must be positive and finite (re-convert the model)");
      }
    }
  } else if (scaling == "llama3") {
    fail(f.path(), ": ", k("rope.scaling.type"),
         " is 'llama3' but tensor 'rope_freqs.weight' is missing; re-convert the model with "
         "llama.cpp's convert_hf_to_gguf.py, which writes the frequency factors");
  }

  c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  switch (c.family) {
    case Arch::Llama:
      break;
    case Arch::Qwen2:
      c.attn_bias = true;
      c.rope_neox = true;
      break;
    case Arch::Gemma3: {
      c.qk_norm = true;
      c.post_norms = true;
      c.act = FfnAct::GeluTanh;
      c.rope_neox = true;
      c.embed_scale = std::sqrt(static_cast<float>(c.dim));
      // 27B (62 layers): query_pre_attn_scalar = dim / n_heads (llama.cpp, gemma_pytorch config).
      if (c.n_layers == 62) c.attn_scale = 1.0f / std::sqrt(float(c.dim) / float(c.n_heads));
      if (f.get_float(k("final_logit_softcapping"), 0.0) != 0.0) {
        fail(f.path(), ": ", k("final_logit_softcapping"), " ",
             f.get_float(k("final_logit_softcapping")),
             " is set; smolrt does not implement logit soft-capping (Gemma 3 has none)");
      }
      const uint64_t window = f.get_uint(k("attention.sliding_window"), 0);
      if (window > (uint64_t{1} << 24)) {
        fail(f.path(), ": ", k("attention.sliding_window"), " ", window,
             " is out of range; expected at most 2^24");
      }
      c.sliding_window = static_cast<int>(window);
      c.rope_base_swa = 10000.f;  // llama.cpp rope_freq_base_train_swa, HF rope_local_base_freq
      if (f.has(k("rope.freq_base_swa"))) {
        const double b = f.get_float(k("rope.freq_base_swa"));
        if (!(b > 0.0) || !std::isfinite(b) || b > 1e12) {
          fail(f.path(), ": ", k("rope.freq_base_swa"), " ", b,
               " must be a positive finite number");
        }
        c.rope_base_swa = static_cast<float>(b);
      }
      if (c.sliding_window > 0) {
        c.swa_layers.assign(static_cast<size_t>(c.n_layers), 0);
        const std::string pk = k("attention.sliding_window_pattern");
        const gguf::Value* pv = f.find(pk);
        if (pv && pv->type == gguf::ValueType::ARRAY) {
          // gguf-py add_sliding_window_pattern: one bool per layer, true = sliding window.
          const auto& a = std::get<gguf::Array>(pv->v);
          if (a.items.size() != static_cast<size_t>(c.n_layers) ||
              (a.elem_type != gguf::ValueType::BOOL && a.elem_type != gguf::ValueType::U8 &&
               a.elem_type != gguf::ValueType::I8 && a.elem_type != gguf::ValueType::U32 &&
               a.elem_type != gguf::ValueType::I32)) {
            fail(f.path(), ": ", pk, " must be an array of ", c.n_layers,
                 " booleans (one per layer, true = sliding window); it has ", a.items.size(),
                 " items of type ", gguf::value_type_name(a.elem_type));
          }
          for (size_t l = 0; l < a.items.size(); ++l) {
            const auto& v = a.items[l].v;
            const bool on = std::holds_alternative<bool>(v)       ? std::get<bool>(v)
                            : std::holds_alternative<uint64_t>(v) ? std::get<uint64_t>(v) != 0
                                                                  : std::get<int64_t>(v) != 0;
            c.swa_layers[l] = on ? 1 : 0;
          }
        } else {
          // A period N: every Nth layer is global (l % N == N - 1). Default 6 (llama.cpp
          // set_swa_pattern(6), HF sliding_window_pattern 6).
          const uint64_t period = pv ? f.get_uint(pk) : 6;
          if (period == 0 || period > kMaxLayers) {
            fail(f.path(), ": ", pk, " ", period, " must be between 1 and ", kMaxLayers);
          }
          for (int l = 0; l < c.n_layers; ++l) {
            c.swa_layers[size_t(l)] = static_cast<uint64_t>(l) % period < period - 1 ? 1 : 0;
          }
        }
      }
      break;
    }
  }
  // The softmax scale, when the file states it (llama.cpp LLM_KV_ATTENTION_SCALE).
  if (f.has(k("attention.scale"))) {
    const double s = f.get_float(k("attention.scale"));
    if (!(s > 0.0) || !std::isfinite(s)) {
      fail(f.path(), ": ", k("attention.scale"), " ", s, " must be a positive finite number");
    }
    c.attn_scale = static_cast<float>(s);
  }

  const gguf::TensorInfo* embd = f.find_tensor("token_embd.weight");
  if (!embd) fail(f.path(), ": tensor 'token_embd.weight' is missing; cannot size the vocabulary");
  if (embd->n_dims != 2 || embd->ne[1] > uint64_t{1} << 24) {
    fail(f.path(), ": token_embd.weight has shape ", shape_str(*embd), ", expected [", c.dim,
         ", vocab_size] with vocab_size <= 2^24");
  }
  c.vocab_size = static_cast<int>(embd->ne[1]);
  if (f.has(k("vocab_size")) && f.get_uint(k("vocab_size")) != embd->ne[1]) {
    fail(f.path(), ": ", k("vocab_size"), " ", f.get_uint(k("vocab_size")),
         " disagrees with token_embd.weight's ", embd->ne[1], " rows");
  }
  c.tied_output = f.find_tensor("output.weight") == nullptr;
  return c;
}

// --- weights
// --------------------------------------------------------------------------------------

Weights load_weights(const gguf::File& f, const ModelConfig& c) {
  Weights w;
  const int64_t dim = c.dim, kv_dim = c.kv_dim(), q_dim = c.q_dim(), hid = c.hidden_dim;
  const std::string& a = c.arch;
  w.token_embd = view(f, a, "token_embd.weight", dim, c.vocab_size, "dim x vocab_size");
  w.output_norm = view(f, a, "output_norm.weight", dim, 0, "dim");
  w.output = f.find_tensor("output.weight")
                 ? view(f, a, "output.weight", dim, c.vocab_size, "dim x vocab_size")
                 : w.token_embd;  // tied
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = cat("blk.", l, ".");
    LayerWeights& L = w.layers[l];
    L.attn_norm = view(f, a, p + "attn_norm.weight", dim, 0, "dim");
    L.wq = view(f, a, p + "attn_q.weight", dim, q_dim, "dim x q_dim");
    L.wk = view(f, a, p + "attn_k.weight", dim, kv_dim, "dim x kv_dim");
    L.wv = view(f, a, p + "attn_v.weight", dim, kv_dim, "dim x kv_dim");
    L.wo = view(f, a, p + "attn_output.weight", q_dim, dim, "q_dim x dim");
    L.ffn_norm = view(f, a, p + "ffn_norm.weight", dim, 0, "dim");
    L.w_gate = view(f, a, p + "ffn_gate.weight", dim, hid, "dim x hidden_dim");
    L.w_up = view(f, a, p + "ffn_up.weight", dim, hid, "dim x hidden_dim");
    L.w_down = view(f, a, p + "ffn_down.weight", hid, dim, "hidden_dim x dim");
    if (c.attn_bias) {
      L.bq = view(f, a, p + "attn_q.bias", q_dim, 0, "q_dim");
      L.bk = view(f, a, p + "attn_k.bias", kv_dim, 0, "kv_dim");
      L.bv = view(f, a, p + "attn_v.bias", kv_dim, 0, "kv_dim");
    }
    if (c.qk_norm) {
      L.q_norm = view(f, a, p + "attn_q_norm.weight", c.head_dim, 0, "head_dim");
      L.k_norm = view(f, a, p + "attn_k_norm.weight", c.head_dim, 0, "head_dim");
    }
    if (c.post_norms) {
      L.post_attn_norm = view(f, a, p + "post_attention_norm.weight", dim, 0, "dim");
      L.post_ffn_norm = view(f, a, p + "post_ffw_norm.weight", dim, 0, "dim");
    }
  }
  // A blk.N tensor beyond block_count means the metadata and the tensors disagree.
  for (const gguf::TensorInfo& t : f.tensors()) {
    if (t.name.rfind("blk.", 0) != 0) continue;
    const char* s = t.name.c_str() + 4;
    char* end = nullptr;
    const unsigned long long layer = std::strtoull(s, &end, 10);
    if (end != s && *end == '.' && layer >= static_cast<unsigned long long>(c.n_layers)) {
      fail(f.path(), ": tensor '", t.name, "' belongs to layer ", layer, " but ", a,
           ".block_count is ", c.n_layers, "; the file is inconsistent");
    }
  }
  return w;
}

Model load_model(const std::string& path) {
  Model m;
  m.file = gguf::File::open(path);
  m.config = load_config(*m.file);
  m.weights = load_weights(*m.file, m.config);
  return m;
}

}  // namespace smolrt
