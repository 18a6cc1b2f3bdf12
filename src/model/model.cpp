// ModelConfig from GGUF metadata and Weights (typed views by role), with every shape and type
// checked against the config.
#include "model/model.h"

#include <cmath>
#include <cstdlib>
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
TensorView view(const gguf::File& f, const std::string& name, int64_t cols, int64_t rows,
                const char* what) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (!t)
    fail(f.path(), ": tensor '", name,
         "' is missing; the file is incomplete or not a llama "
         "model");
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
    fail(f.path(), ": norm tensor '", name, "' has type ", ti->name,
         "; norm weights must be f32 (re-convert the model)");
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

ModelConfig load_config(const gguf::File& f) {
  ModelConfig c;
  if (!f.has("general.architecture")) {
    fail(f.path(),
         ": metadata 'general.architecture' is missing; this GGUF holds no model "
         "(a vocab-only file?); smolrt needs a llama model");
  }
  c.arch = f.get_string("general.architecture");
  if (c.arch != "llama") {
    fail(f.path(), ": architecture '", c.arch,
         "' is not supported; smolrt runs llama-family models only (general.architecture must be "
         "'llama')");
  }
  c.dim = get_dim(f, "llama.embedding_length", kMaxDim);
  c.n_layers = get_dim(f, "llama.block_count", kMaxLayers);
  c.hidden_dim = get_dim(f, "llama.feed_forward_length", kMaxDim);
  c.n_heads = get_dim(f, "llama.attention.head_count", kMaxDim);
  c.n_kv_heads = f.has("llama.attention.head_count_kv")
                     ? get_dim(f, "llama.attention.head_count_kv", kMaxDim)
                     : c.n_heads;
  c.n_ctx_train = get_dim(f, "llama.context_length", uint64_t{1} << 24);
  if (c.dim % c.n_heads != 0) {
    fail(f.path(), ": llama.embedding_length ", c.dim,
         " is not divisible by "
         "llama.attention.head_count ",
         c.n_heads);
  }
  if (c.n_heads % c.n_kv_heads != 0) {
    fail(f.path(), ": llama.attention.head_count ", c.n_heads,
         " is not a multiple of "
         "llama.attention.head_count_kv ",
         c.n_kv_heads);
  }
  c.head_dim = c.dim / c.n_heads;
  c.rope_dim = f.has("llama.rope.dimension_count")
                   ? get_dim(f, "llama.rope.dimension_count", kMaxDim)
                   : c.head_dim;
  if (c.rope_dim > c.head_dim || c.rope_dim % 2 != 0) {
    fail(f.path(), ": llama.rope.dimension_count ", c.rope_dim,
         " must be even and at most "
         "head_dim ",
         c.head_dim);
  }
  const double base = f.get_float("llama.rope.freq_base", 10000.0);
  if (!(base > 0.0) || !std::isfinite(base) || base > 1e12) {
    fail(f.path(), ": llama.rope.freq_base ", base, " must be a positive finite number");
  }
  c.rope_base = static_cast<float>(base);
  const double eps = f.get_float("llama.attention.layer_norm_rms_epsilon");
  if (!(eps > 0.0) || !(eps < 1.0)) {
    fail(f.path(), ": llama.attention.layer_norm_rms_epsilon ", eps,
         " must be in (0, 1) (typically 1e-5)");
  }
  c.norm_eps = static_cast<float>(eps);
  c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  const gguf::TensorInfo* embd = f.find_tensor("token_embd.weight");
  if (!embd) fail(f.path(), ": tensor 'token_embd.weight' is missing; cannot size the vocabulary");
  if (embd->n_dims != 2 || embd->ne[1] > uint64_t{1} << 24) {
    fail(f.path(), ": token_embd.weight has shape ", shape_str(*embd), ", expected [", c.dim,
         ", vocab_size] with vocab_size <= 2^24");
  }
  c.vocab_size = static_cast<int>(embd->ne[1]);
  if (f.has("llama.vocab_size") && f.get_uint("llama.vocab_size") != embd->ne[1]) {
    fail(f.path(), ": llama.vocab_size ", f.get_uint("llama.vocab_size"),
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
  w.token_embd = view(f, "token_embd.weight", dim, c.vocab_size, "dim x vocab_size");
  w.output_norm = view(f, "output_norm.weight", dim, 0, "dim");
  w.output = f.find_tensor("output.weight")
                 ? view(f, "output.weight", dim, c.vocab_size, "dim x vocab_size")
                 : w.token_embd;  // tied
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = cat("blk.", l, ".");
    LayerWeights& L = w.layers[l];
    L.attn_norm = view(f, p + "attn_norm.weight", dim, 0, "dim");
    L.wq = view(f, p + "attn_q.weight", dim, q_dim, "dim x q_dim");
    L.wk = view(f, p + "attn_k.weight", dim, kv_dim, "dim x kv_dim");
    L.wv = view(f, p + "attn_v.weight", dim, kv_dim, "dim x kv_dim");
    L.wo = view(f, p + "attn_output.weight", q_dim, dim, "q_dim x dim");
    L.ffn_norm = view(f, p + "ffn_norm.weight", dim, 0, "dim");
    L.w_gate = view(f, p + "ffn_gate.weight", dim, hid, "dim x hidden_dim");
    L.w_up = view(f, p + "ffn_up.weight", dim, hid, "dim x hidden_dim");
    L.w_down = view(f, p + "ffn_down.weight", hid, dim, "hidden_dim x dim");
  }
  // A blk.N tensor beyond block_count means the metadata and the tensors disagree.
  for (const gguf::TensorInfo& t : f.tensors()) {
    if (t.name.rfind("blk.", 0) != 0) continue;
    const char* s = t.name.c_str() + 4;
    char* end = nullptr;
    const unsigned long long layer = std::strtoull(s, &end, 10);
    if (end != s && *end == '.' && layer >= static_cast<unsigned long long>(c.n_layers)) {
      fail(f.path(), ": tensor '", t.name, "' belongs to layer ", layer,
           " but llama.block_count is ", c.n_layers, "; the file is inconsistent");
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
