// load_config / load_weights on tiny llama GGUFs built with the Writer: defaults, tied output,
// and one clear Error per wrong shape, type, key or architecture.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "core/error.h"
#include "gguf/gguf.h"
#include "model/model.h"

namespace smolrt {
namespace {

using gguf::Value;

// dim 64, 2 layers, 4 heads / 2 kv heads (head_dim 16, kv_dim 32), hidden 96, vocab 40.
struct TinyLlama {
  std::string arch = "llama";
  uint32_t dim = 64, n_layers = 2, n_heads = 4, n_kv = 2, hidden = 96, vocab = 40;
  GgmlType mat = GgmlType::Q8_0;
  bool tied = true;
  std::map<std::string, std::pair<std::vector<uint64_t>, GgmlType>> override_;
  std::set<std::string> skip;
  std::vector<std::pair<std::string, Value>> extra_kv;
  std::set<std::string> skip_kv;

  std::vector<std::vector<uint8_t>> store;
  std::mt19937 rng{1};

  void add(gguf::Writer& w, const std::string& name, std::vector<uint64_t> ne, GgmlType t) {
    if (skip.count(name)) return;
    if (auto it = override_.find(name); it != override_.end()) std::tie(ne, t) = it->second;
    const TypeInfo* ti = type_info(t);
    uint64_t n = row_bytes(*ti, ne[0]);
    for (size_t d = 1; d < ne.size(); ++d) n *= ne[d];
    std::vector<uint8_t> data(n);
    for (uint8_t& b : data) b = static_cast<uint8_t>(rng() | 0x10);
    store.push_back(std::move(data));
    w.add_tensor(name, ne, t, store.back().data(), n);
  }

  std::shared_ptr<gguf::File> build() {
    gguf::Writer w;
    std::vector<std::pair<std::string, Value>> kv = {
        {"general.architecture", Value::str(arch)},
        {"llama.context_length", Value::u32(256)},
        {"llama.embedding_length", Value::u32(dim)},
        {"llama.block_count", Value::u32(n_layers)},
        {"llama.feed_forward_length", Value::u32(hidden)},
        {"llama.attention.head_count", Value::u32(n_heads)},
        {"llama.attention.head_count_kv", Value::u32(n_kv)},
        {"llama.attention.layer_norm_rms_epsilon", Value::f32(1e-5f)},
    };
    for (auto& [k, v] : kv) {
      if (!skip_kv.count(k)) w.set(k, v);
    }
    for (auto& [k, v] : extra_kv) w.set(k, v);  // added after the skips: replaces a skipped key
    const uint64_t kv_dim = uint64_t{dim} / n_heads * n_kv;
    add(w, "token_embd.weight", {dim, vocab}, mat);
    add(w, "output_norm.weight", {dim}, GgmlType::F32);
    if (!tied) add(w, "output.weight", {dim, vocab}, mat);
    for (uint32_t l = 0; l < n_layers; ++l) {
      const std::string p = cat("blk.", l, ".");
      add(w, p + "attn_norm.weight", {dim}, GgmlType::F32);
      add(w, p + "attn_q.weight", {dim, dim}, mat);
      add(w, p + "attn_k.weight", {dim, kv_dim}, mat);
      add(w, p + "attn_v.weight", {dim, kv_dim}, mat);
      add(w, p + "attn_output.weight", {dim, dim}, mat);
      add(w, p + "ffn_norm.weight", {dim}, GgmlType::F32);
      add(w, p + "ffn_gate.weight", {dim, hidden}, mat);
      add(w, p + "ffn_up.weight", {dim, hidden}, mat);
      add(w, p + "ffn_down.weight", {hidden, dim}, mat);
    }
    return gguf::File::parse(w.to_bytes(), "tiny.gguf");
  }
};

// load_config + load_weights must throw an Error containing `sub`.
void expect_model_error(TinyLlama& m, const std::string& sub) {
  try {
    const auto f = m.build();
    const ModelConfig c = load_config(*f);
    load_weights(*f, c);
    ADD_FAILURE() << "loaded without error, expected '" << sub << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(sub), std::string::npos) << msg;
    EXPECT_NE(msg.find("tiny.gguf"), std::string::npos) << msg;
  }
}

TEST(ModelLoad, TinyTiedWithDefaults) {
  TinyLlama m;
  const auto f = m.build();
  const ModelConfig c = load_config(*f);
  EXPECT_EQ(c.arch, "llama");
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.kv_dim(), 32);
  EXPECT_EQ(c.hidden_dim, 96);
  EXPECT_EQ(c.vocab_size, 40);
  EXPECT_EQ(c.n_ctx_train, 256);
  EXPECT_EQ(c.rope_dim, 16);        // default head_dim
  EXPECT_EQ(c.rope_base, 10000.f);  // default
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-5f);
  EXPECT_TRUE(c.tied_output);
  const Weights w = load_weights(*f, c);
  EXPECT_EQ(w.output.data, w.token_embd.data);
  EXPECT_EQ(w.token_embd.rows, 40);
  EXPECT_EQ(w.token_embd.cols, 64);
  EXPECT_EQ(w.token_embd.type, GgmlType::Q8_0);
  EXPECT_EQ(w.token_embd.row_stride(), 2u * 34u);
  ASSERT_EQ(w.layers.size(), 2u);
  const LayerWeights& L = w.layers[1];
  EXPECT_EQ(L.wk.rows, 32);
  EXPECT_EQ(L.wk.cols, 64);
  EXPECT_EQ(L.w_down.rows, 64);
  EXPECT_EQ(L.w_down.cols, 96);
  EXPECT_EQ(L.attn_norm.rows, 1);
  EXPECT_EQ(L.attn_norm.cols, 64);
  EXPECT_EQ(L.attn_norm.nbytes, 256u);
  EXPECT_EQ(L.wq.data, f->find_tensor("blk.1.attn_q.weight")->data);
  EXPECT_EQ(L.wq.name, "blk.1.attn_q.weight");
  EXPECT_EQ(L.w_up.nbytes, f->find_tensor("blk.1.ffn_up.weight")->nbytes);
}

TEST(ModelLoad, UntiedAndExplicitRope) {
  TinyLlama m;
  m.tied = false;
  m.mat = GgmlType::Q4_0;
  m.extra_kv = {{"llama.rope.freq_base", Value::f32(100000.f)},
                {"llama.rope.dimension_count", Value::u32(8)},
                {"llama.vocab_size", Value::u32(40)}};
  const auto f = m.build();
  const ModelConfig c = load_config(*f);
  EXPECT_FALSE(c.tied_output);
  EXPECT_EQ(c.rope_base, 100000.f);
  EXPECT_EQ(c.rope_dim, 8);
  const Weights w = load_weights(*f, c);
  EXPECT_NE(w.output.data, w.token_embd.data);
  EXPECT_EQ(w.output.name, "output.weight");
  EXPECT_EQ(w.layers[0].wq.type, GgmlType::Q4_0);
}

TEST(ModelLoad, RejectsOtherArchitectures) {
  TinyLlama m;
  m.arch = "falcon";
  expect_model_error(m, "architecture 'falcon' is not supported");
  TinyLlama n;
  n.skip_kv = {"general.architecture"};
  expect_model_error(n, "'general.architecture' is missing");
}

TEST(ModelLoad, MissingAndBadKeys) {
  TinyLlama m;
  m.skip_kv = {"llama.block_count"};
  expect_model_error(m, "'llama.block_count' is missing");
  TinyLlama e;
  e.skip_kv = {"llama.attention.layer_norm_rms_epsilon"};
  expect_model_error(e, "'llama.attention.layer_norm_rms_epsilon' is missing");
  TinyLlama h;
  h.n_kv = 3;  // 4 heads are not a multiple of 3 kv heads
  expect_model_error(h, "is not a multiple of llama.attention.head_count_kv 3");
  TinyLlama s;
  s.skip_kv = {"llama.feed_forward_length"};
  s.extra_kv = {{"llama.feed_forward_length", Value::str("96")}};
  expect_model_error(s, "has type string, expected an unsigned integer");
  TinyLlama z;
  z.skip_kv = {"llama.embedding_length"};
  z.extra_kv = {{"llama.embedding_length", Value::u32(0)}};
  expect_model_error(z, "'llama.embedding_length' is 0");
  TinyLlama v;
  v.extra_kv = {{"llama.vocab_size", Value::u32(41)}};
  expect_model_error(v, "llama.vocab_size 41 disagrees");
  TinyLlama r;
  r.extra_kv = {{"llama.rope.dimension_count", Value::u32(17)}};
  expect_model_error(r, "llama.rope.dimension_count 17 must be even");
}

TEST(ModelLoad, WrongShapesNameTensorAndExpectation) {
  TinyLlama m;
  m.override_["blk.1.attn_k.weight"] = {{64, 64}, GgmlType::Q8_0};
  expect_model_error(m, "blk.1.attn_k.weight has shape [64, 64], expected [64, 32] (dim x kv_dim)");
  TinyLlama d;
  d.override_["blk.0.ffn_down.weight"] = {{64, 96}, GgmlType::Q8_0};
  expect_model_error(d, "blk.0.ffn_down.weight has shape [64, 96], expected [96, 64]");
  TinyLlama n;
  n.override_["output_norm.weight"] = {{64, 1}, GgmlType::F32};
  expect_model_error(n, "output_norm.weight has shape [64, 1], expected [64] (dim)");
  TinyLlama o;
  o.tied = false;
  o.override_["output.weight"] = {{64, 41}, GgmlType::Q8_0};
  expect_model_error(o, "output.weight has shape [64, 41], expected [64, 40] (dim x vocab_size)");
}

TEST(ModelLoad, UncomputableAndNonF32NormTypes) {
  TinyLlama m;
  m.override_["blk.0.ffn_up.weight"] = {{64, 96}, GgmlType::Q8_1};
  expect_model_error(m, "tensor 'blk.0.ffn_up.weight' has type q8_1, which smolrt cannot compute");
  TinyLlama n;
  n.override_["blk.1.ffn_norm.weight"] = {{64}, GgmlType::F16};
  expect_model_error(n, "norm tensor 'blk.1.ffn_norm.weight' has type f16");
}

TEST(ModelLoad, MissingAndExtraTensors) {
  TinyLlama m;
  m.skip = {"blk.1.ffn_down.weight"};
  expect_model_error(m, "tensor 'blk.1.ffn_down.weight' is missing");
  TinyLlama e;
  e.skip = {"token_embd.weight"};
  expect_model_error(e, "tensor 'token_embd.weight' is missing");
  TinyLlama x;
  x.n_layers = 3;
  x.skip_kv = {"llama.block_count"};
  x.extra_kv = {{"llama.block_count", Value::u32(2)}};
  expect_model_error(x, "tensor 'blk.2.attn_norm.weight' belongs to layer 2");
}

}  // namespace
}  // namespace smolrt
