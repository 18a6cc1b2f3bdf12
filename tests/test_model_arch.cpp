// load_config / load_weights for the qwen2, gemma3 and llama3 families on tiny synth files: every
// switch read back from the file, the documented defaults (gemma3's swa period 6), and one clear
// Error naming the key or tensor for each malformed case.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "core/paths.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "model/synth.h"
#include "test_util.h"

namespace smolrt {
namespace {

using gguf::Value;

// A synth preset's file, optionally rewritten: keys set or removed, tensors dropped.
struct Edit {
  std::vector<std::pair<std::string, Value>> set;
  std::set<std::string> remove_kv;
  std::set<std::string> drop;
  // Replace a tensor by an F32 1-D tensor of these values (for rope_freqs / bias edits).
  std::string replace_name;
  std::vector<float> replace_values;
};

std::shared_ptr<gguf::File> synth_file(const std::string& preset, const Edit& e = {},
                                       QuantTarget type = GgmlType::F32) {
  SynthOptions o;
  o.preset = preset;
  o.type = type;
  o.seed = 5;
  SynthModel m = synth_model(o);
  const std::vector<uint8_t> bytes = m.writer.to_bytes();
  auto f = gguf::File::parse(bytes, "arch.gguf");
  gguf::Writer w;
  for (const auto& [k, v] : f->metadata()) {
    if (!e.remove_kv.count(k)) w.set(k, v);
  }
  for (const auto& [k, v] : e.set) w.set(k, v);
  for (const gguf::TensorInfo& t : f->tensors()) {
    if (e.drop.count(t.name)) continue;
    if (t.name == e.replace_name) {
      w.add_tensor(t.name, {e.replace_values.size()}, GgmlType::F32, e.replace_values.data(),
                   e.replace_values.size() * sizeof(float));
      continue;
    }
    w.add_tensor(t.name, std::vector<uint64_t>(t.ne, t.ne + t.n_dims), t.type, t.data, t.nbytes);
  }
  return gguf::File::parse(w.to_bytes(), "arch.gguf");
}

void expect_error(const std::string& preset, const Edit& e, const std::string& sub) {
  try {
    const auto f = synth_file(preset, e);
    const ModelConfig c = load_config(*f);
    load_weights(*f, c);
    ADD_FAILURE() << preset << ": loaded without error, expected '" << sub << "'";
  } catch (const Error& err) {
    const std::string msg = err.what();
    EXPECT_NE(msg.find(sub), std::string::npos) << msg;
    EXPECT_NE(msg.find("arch.gguf"), std::string::npos) << msg;
  }
}

TEST(ModelArch, Qwen2BiasesAndNeox) {
  const auto f = synth_file("tiny-qwen2");
  const ModelConfig c = load_config(*f);
  EXPECT_EQ(c.arch, "qwen2");
  EXPECT_EQ(c.family, Arch::Qwen2);
  EXPECT_TRUE(c.attn_bias);
  EXPECT_TRUE(c.rope_neox);
  EXPECT_FALSE(c.qk_norm || c.post_norms);
  EXPECT_EQ(c.act, FfnAct::Silu);
  EXPECT_EQ(c.embed_scale, 1.f);
  EXPECT_EQ(c.rope_base, 1e6f);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-6f);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_FLOAT_EQ(c.attn_scale, 0.125f);
  EXPECT_TRUE(c.swa_layers.empty());
  EXPECT_TRUE(c.rope_freq_factors.empty());
  const Weights w = load_weights(*f, c);
  EXPECT_EQ(w.layers[1].bq.cols, 256);
  EXPECT_EQ(w.layers[1].bk.cols, 128);
  EXPECT_EQ(w.layers[1].bv.cols, 128);
  EXPECT_EQ(w.layers[1].bv.type, GgmlType::F32);
  EXPECT_NE(w.layers[1].bq.data, nullptr);
  EXPECT_EQ(w.layers[1].q_norm.data, nullptr);
}

TEST(ModelArch, Gemma3SwitchesWindowAndPattern) {
  const auto f = synth_file("tiny-gemma3");
  const ModelConfig c = load_config(*f);
  EXPECT_EQ(c.family, Arch::Gemma3);
  EXPECT_EQ(c.head_dim, 128);  // attention.key_length, not dim / n_heads = 64
  EXPECT_EQ(c.q_dim(), 512);
  EXPECT_EQ(c.kv_dim(), 256);
  EXPECT_TRUE(c.qk_norm && c.post_norms && c.rope_neox);
  EXPECT_FALSE(c.attn_bias);
  EXPECT_EQ(c.act, FfnAct::GeluTanh);
  EXPECT_FLOAT_EQ(c.embed_scale, 16.f);  // sqrt(256)
  EXPECT_FLOAT_EQ(c.attn_scale, 1.f / std::sqrt(128.f));
  EXPECT_EQ(c.sliding_window, 8);
  EXPECT_EQ(c.swa_layers, (std::vector<uint8_t>{1, 1, 0, 1}));  // the file's bool array
  EXPECT_EQ(c.rope_base, 1e6f);
  EXPECT_EQ(c.rope_base_swa, 10000.f);
  EXPECT_EQ(c.layer_rope_base(0), 10000.f);
  EXPECT_EQ(c.layer_rope_base(2), 1e6f);
  EXPECT_EQ(c.first_key(0, 7), 0);
  EXPECT_EQ(c.first_key(0, 8), 1);
  EXPECT_EQ(c.first_key(0, 100), 93);
  EXPECT_EQ(c.first_key(2, 100), 0);  // global
  const Weights w = load_weights(*f, c);
  EXPECT_EQ(w.layers[3].q_norm.cols, 128);
  EXPECT_EQ(w.layers[3].k_norm.cols, 128);
  EXPECT_EQ(w.layers[3].post_attn_norm.cols, 256);
  EXPECT_EQ(w.layers[3].post_ffn_norm.cols, 256);
  EXPECT_EQ(w.layers[3].wq.rows, 512);
  EXPECT_EQ(w.layers[3].wo.cols, 512);

  // Without the pattern key: the documented period 6 (layers 5, 11, ... global).
  Edit e;
  e.remove_kv = {"gemma3.attention.sliding_window_pattern"};
  const ModelConfig d = load_config(*synth_file("tiny-gemma3", e));
  EXPECT_EQ(d.swa_layers, (std::vector<uint8_t>{1, 1, 1, 1}));
  // A period as an integer.
  Edit p;
  p.set = {{"gemma3.attention.sliding_window_pattern", Value::u32(2)}};
  EXPECT_EQ(load_config(*synth_file("tiny-gemma3", p)).swa_layers,
            (std::vector<uint8_t>{1, 0, 1, 0}));
  // No window: no local layers.
  Edit n;
  n.remove_kv = {"gemma3.attention.sliding_window"};
  const ModelConfig g = load_config(*synth_file("tiny-gemma3", n));
  EXPECT_EQ(g.sliding_window, 0);
  EXPECT_FALSE(g.is_swa(0));
  EXPECT_EQ(g.first_key(0, 100), 0);
}

TEST(ModelArch, Gemma3RealShapePresetDefaults) {
  // The 270m shape's config (metadata only: the tensors are not read here).
  SynthOptions o;
  o.preset = "gemma3-270m";
  const SynthPreset& p = synth_preset(o.preset);
  EXPECT_EQ(p.hd(), 256);
  const std::vector<TensorShape> t = synth_tensors(p, 262144);
  bool saw_qnorm = false;
  for (const TensorShape& s : t) {
    if (s.name == "blk.0.attn_q.weight") {
      EXPECT_EQ(s.ne[1], 1024u);  // 4 heads x 256
    }
    if (s.name == "blk.0.attn_output.weight") {
      EXPECT_EQ(s.ne[0], 1024u);
    }
    if (s.name == "blk.17.attn_q_norm.weight") saw_qnorm = s.ne[0] == 256u;
  }
  EXPECT_TRUE(saw_qnorm);
}

TEST(ModelArch, Llama3FrequencyFactorsAndUntiedOutput) {
  const auto f = synth_file("tiny-llama3");
  const ModelConfig c = load_config(*f);
  EXPECT_EQ(c.family, Arch::Llama);
  EXPECT_FALSE(c.rope_neox);
  EXPECT_FALSE(c.tied_output);
  ASSERT_EQ(c.rope_freq_factors.size(), 32u);
  // base 500000, rope_dim 64, original ctx 64, low 1, high 4: wavelength 2 pi * 500000^(i/32) is
  // below 16 for i <= 2 (factor 1), between 16 and 64 for i = 3..5 (blended: 1.494, 2.889,
  // 7.598), above 64 from i = 6 (factor 32).
  for (int i = 0; i <= 2; ++i) EXPECT_EQ(c.rope_freq_factors[size_t(i)], 1.f) << i;
  const double want[3] = {1.4935856818570363, 2.8886335541836115, 7.5980844527176};
  for (int i = 3; i <= 5; ++i) {
    EXPECT_NEAR(c.rope_freq_factors[size_t(i)], want[i - 3], 1e-5) << i;
  }
  for (int i = 6; i < 32; ++i) EXPECT_EQ(c.rope_freq_factors[size_t(i)], 32.f) << i;
  const Weights w = load_weights(*f, c);
  EXPECT_NE(w.output.data, w.token_embd.data);
  // The real-shape preset writes 32 factors.
  const SynthPreset& p = synth_preset("llama-3.2-1b");
  EXPECT_EQ(llama3_rope_factors(p, 64).size(), 32u);
  EXPECT_EQ(llama3_rope_factors(p, 64).back(), 32.f);
  EXPECT_EQ(llama3_rope_factors(p, 64).front(), 1.f);
}

TEST(ModelArch, MalformedFilesNameKeyOrTensor) {
  Edit b;
  b.drop = {"blk.1.attn_k.bias"};
  expect_error("tiny-qwen2", b, "tensor 'blk.1.attn_k.bias' is missing");
  expect_error("tiny-qwen2", b, "not a qwen2 model");
  Edit bs;
  bs.replace_name = "blk.0.attn_q.bias";
  bs.replace_values.assign(255, 0.f);
  expect_error("tiny-qwen2", bs, "blk.0.attn_q.bias has shape [255], expected [256] (q_dim)");
  Edit qn;
  qn.drop = {"blk.2.attn_q_norm.weight"};
  expect_error("tiny-gemma3", qn, "tensor 'blk.2.attn_q_norm.weight' is missing");
  Edit pn;
  pn.drop = {"blk.0.post_ffw_norm.weight"};
  expect_error("tiny-gemma3", pn, "tensor 'blk.0.post_ffw_norm.weight' is missing");
  Edit kn;
  kn.replace_name = "blk.1.attn_k_norm.weight";
  kn.replace_values.assign(64, 1.f);
  expect_error("tiny-gemma3", kn, "blk.1.attn_k_norm.weight has shape [64], expected [128]");
  Edit kl;  // without key_length the head size would be 16 and attn_q's 128 rows disagree
  kl.remove_kv = {"gemma3.attention.key_length", "gemma3.attention.value_length",
                  "gemma3.rope.dimension_count"};
  expect_error("tiny-gemma3", kl, "blk.0.attn_q.weight has shape [256, 512], expected [256, 256]");
  Edit vl;
  vl.set = {{"gemma3.attention.value_length", Value::u32(64)}};
  expect_error("tiny-gemma3", vl,
               "gemma3.attention.value_length 64 differs from the head size 128");
  Edit pat;
  pat.set = {{"gemma3.attention.sliding_window_pattern",
              Value::array(gguf::ValueType::BOOL, {Value::boolean(true)})}};
  expect_error("tiny-gemma3", pat, "gemma3.attention.sliding_window_pattern must be an array of 4");
  Edit cap;
  cap.set = {{"gemma3.final_logit_softcapping", Value::f32(30.f)}};
  expect_error("tiny-gemma3", cap, "gemma3.final_logit_softcapping 30 is set");
  Edit pre;  // keys under the wrong prefix: the family's own key is what is missing
  pre.remove_kv = {"gemma3.block_count"};
  pre.set = {{"llama.block_count", Value::u32(4)}};
  expect_error("tiny-gemma3", pre, "'gemma3.block_count' is missing");
  Edit rf;
  rf.replace_name = "rope_freqs.weight";
  rf.replace_values.assign(31, 1.f);
  expect_error("tiny-llama3", rf, "rope_freqs.weight has shape [31]");
  Edit rz;
  rz.replace_name = "rope_freqs.weight";
  rz.replace_values.assign(32, 1.f);
  rz.replace_values[3] = 0.f;
  expect_error("tiny-llama3", rz, "rope_freqs.weight[3] is 0");
  Edit yarn;
  yarn.set = {{"llama.rope.scaling.type", Value::str("yarn")},
              {"llama.rope.scaling.factor", Value::f32(4.f)}};
  expect_error("tiny-llama3", yarn,
               "llama.rope.scaling.type 'yarn' with llama.rope.scaling.factor 4 is not supported");
  Edit lin;
  lin.set = {{"qwen2.rope.scaling.type", Value::str("linear")},
             {"qwen2.rope.scaling.factor", Value::f32(8.f)}};
  expect_error("tiny-qwen2", lin, "qwen2.rope.scaling.type 'linear'");
  Edit l3;
  l3.set = {{"llama.rope.scaling.type", Value::str("llama3")}};
  l3.drop = {"rope_freqs.weight"};
  expect_error("tiny-llama3", l3, "tensor 'rope_freqs.weight' is missing");
  Edit sc;  // an explicit softmax scale is used as given; a non-positive one is refused
  sc.set = {{"qwen2.attention.scale", Value::f32(0.5f)}};
  EXPECT_EQ(load_config(*synth_file("tiny-qwen2", sc)).attn_scale, 0.5f);
  sc.set = {{"qwen2.attention.scale", Value::f32(0.f)}};
  expect_error("tiny-qwen2", sc, "qwen2.attention.scale 0 must be a positive finite number");
  // Linear with factor 1 is "no scaling" and loads.
  Edit ok;
  ok.set = {{"qwen2.rope.scaling.type", Value::str("linear")},
            {"qwen2.rope.scaling.factor", Value::f32(1.f)}};
  EXPECT_NO_THROW(load_config(*synth_file("tiny-qwen2", ok)));
}

}  // namespace
}  // namespace smolrt

namespace smolrt {
namespace {

uint64_t params_of(const std::vector<TensorShape>& t) {
  uint64_t n = 0;
  for (const TensorShape& s : t) n += s.ne[0] * s.ne[1];
  return n;
}

TEST(ModelArch, RealShapePresetsHaveTheModelsParameterCounts) {
  // The published parameter counts (tied embeddings counted once): Qwen2.5-0.5B 494,032,768,
  // Llama-3.2-1B 1,235,814,400 (+ the 32 rope_freqs factors, not parameters), gemma-3-270m
  // 268,098,176.
  EXPECT_EQ(params_of(synth_tensors(synth_preset("qwen2.5-0.5b"), 151936)), 494032768u);
  EXPECT_EQ(params_of(synth_tensors(synth_preset("llama-3.2-1b"), 128256)), 1235814400u + 32u);
  EXPECT_EQ(params_of(synth_tensors(synth_preset("gemma3-270m"), 262144)), 268098176u);
}

TEST(ModelArch, RealGemmaFileMatchesThePreset) {
  const std::filesystem::path path = cache_dir() / "gemma-3-270m-q4_k_m.gguf";
  if (!std::filesystem::exists(path)) {
    GTEST_SKIP() << path << " not found; run scripts/fetch_model.sh gemma3-270m";
  }
  const Model m = load_model(path.string());
  const ModelConfig& c = m.config;
  EXPECT_EQ(c.family, Arch::Gemma3);
  EXPECT_EQ(c.dim, 640);
  EXPECT_EQ(c.n_layers, 18);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 1);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.hidden_dim, 2048);
  EXPECT_EQ(c.vocab_size, 262144);
  EXPECT_EQ(c.sliding_window, 512);
  EXPECT_EQ(c.rope_base, 1e6f);
  EXPECT_EQ(c.rope_base_swa, 10000.f);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-6f);
  EXPECT_FLOAT_EQ(c.attn_scale, 1.f / 16.f);
  EXPECT_TRUE(c.tied_output);
  for (int l = 0; l < 18; ++l) EXPECT_EQ(c.is_swa(l), l % 6 != 5) << l;
  EXPECT_EQ(m.weights.token_embd.type, GgmlType::Q8_0);
  // Same tensor names and shapes as the synth preset.
  const std::vector<TensorShape> want = synth_tensors(synth_preset("gemma3-270m"), 262144);
  EXPECT_EQ(m.file->tensors().size(), want.size());
  for (const TensorShape& s : want) {
    const gguf::TensorInfo* t = m.file->find_tensor(s.name);
    ASSERT_NE(t, nullptr) << s.name;
    EXPECT_EQ(t->n_dims, s.n_dims) << s.name;
    EXPECT_EQ(t->ne[0], s.ne[0]) << s.name;
    EXPECT_EQ(t->ne[1], s.ne[1]) << s.name;
  }
}

}  // namespace
}  // namespace smolrt

namespace smolrt {
namespace {

// `smolrt synth` + `smolrt info` on each tiny family preset: the architecture and its particulars.
TEST(ModelArchCli, SynthThenInfoShowsTheSwitches) {
  const std::string dir = std::filesystem::temp_directory_path().string();
  struct Case {
    const char* preset;
    std::vector<std::string> want;
  };
  const std::vector<Case> cases = {
      {"tiny-qwen2",
       {"model:         qwen2, dim 256", "rope:          neox, q_dim 256",
        "block:         q/k/v bias yes, qk-norm no, post norms no, ffn silu, embed scale 1"}},
      {"tiny-llama3",
       {"model:         llama, dim 256", "separate output.weight",
        "rope:          normal, q_dim 256, llama3 frequency factors (32, 1 .. 32)"}},
      {"tiny-gemma3",
       {"model:         gemma3, dim 256, 4 layers, 4 heads / 2 kv heads, head_dim 128",
        "rope:          neox, q_dim 512",
        "sliding window 8 on local layers [0,1,3] (rope base 10000), global layers rope base 1e+06",
        "qk-norm yes, post norms yes, ffn gelu_tanh, embed scale 16"}},
  };
  for (const Case& c : cases) {
    const std::string out = cat(dir, "/smolrt_arch_", ::getpid(), "_", c.preset, ".gguf");
    const test::Proc s =
        test::run_subcommand("synth", {"--preset", c.preset, "--type", "q8_0", "-o", out});
    ASSERT_EQ(s.rc, 0) << s.err;
    const test::Proc i = test::run_subcommand("info", {"-m", out});
    std::filesystem::remove(out);
    ASSERT_EQ(i.rc, 0) << i.err;
    for (const std::string& w : c.want)
      EXPECT_NE(i.out.find(w), std::string::npos) << w << "\n" << i.out;
  }
}

}  // namespace
}  // namespace smolrt
