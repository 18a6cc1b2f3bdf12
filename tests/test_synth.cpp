// smolrt synth: determinism, the SmolLM-135M Q4_0 layout (272 tensors, 134,515,008 params,
// 89,941,248 bytes = 85.77 MiB), weight statistics, and that the files load as models.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <map>

#include "core/error.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "model/synth.h"
#include "quant/quantize.h"
#include "test_util.h"

namespace smolrt {
namespace {

std::shared_ptr<gguf::File> synth_file(const SynthOptions& o, std::vector<uint8_t>* bytes_out) {
  SynthModel m = synth_model(o);
  std::vector<uint8_t> bytes = m.writer.to_bytes();
  auto f = gguf::File::parse(bytes, "synth:" + o.preset);
  if (bytes_out) *bytes_out = std::move(bytes);
  return f;
}

TEST(Synth, SameSeedSameBytesOtherSeedOtherBytes) {
  SynthOptions o;
  o.preset = "tiny";
  o.seed = 7;
  const std::vector<uint8_t> a = synth_model(o).writer.to_bytes();
  const std::vector<uint8_t> b = synth_model(o).writer.to_bytes();
  EXPECT_EQ(a, b);
  o.seed = 8;
  const std::vector<uint8_t> c = synth_model(o).writer.to_bytes();
  ASSERT_EQ(a.size(), c.size());  // same layout (the seed is only in general.name's digits)
  EXPECT_NE(a, c);
  // Not just the name: the tensor data differs.
  auto fa = gguf::File::parse(a, "a"), fc = gguf::File::parse(c, "c");
  const auto* ta = fa->find_tensor("blk.1.ffn_up.weight");
  const auto* tc = fc->find_tensor("blk.1.ffn_up.weight");
  ASSERT_TRUE(ta && tc);
  EXPECT_NE(std::memcmp(ta->data, tc->data, ta->nbytes), 0);
}

TEST(Synth, SmolLM135MQ4_0LayoutAndCounts) {
  SynthOptions o;
  o.preset = "smollm-135m";
  o.type = GgmlType::Q4_0;
  const auto t0 = std::chrono::steady_clock::now();
  SynthModel m = synth_model(o);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("synth smollm-135m q4_0: %.2f s\n", secs);
  EXPECT_EQ(m.n_tensors, 272u);
  EXPECT_EQ(m.n_params, 134515008u);
  // 210 Q4_0 matrices: 30 * 3,538,944 / 32 * 18 = 59,719,680; Q8_0 embedding: 49152 * 576 / 32
  // * 34 = 30,081,024; 61 F32 norms: (60 + 1) * 576 * 4 = 140,544.
  EXPECT_EQ(m.tensor_bytes, 89941248u);
  EXPECT_NEAR(m.tensor_bytes / 1048576.0, 85.77, 0.005);
  EXPECT_EQ(m.vocab_size, 49152);

  const std::vector<uint8_t> bytes = m.writer.to_bytes();
  auto f = gguf::File::parse(bytes, "synth-135m");
  test::expect_smollm135m_q4_0_layout(*f);  // also: Q8_0 embedding, tied output
  const auto* emb = f->find_tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->ne[0], 576u);
  EXPECT_EQ(emb->ne[1], 49152u);
  EXPECT_EQ(f->get_uint("general.file_type"), 2u);
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens").size(), 49152u);

  const ModelConfig c = load_config(*f);
  EXPECT_EQ(c.dim, 576);
  EXPECT_EQ(c.n_layers, 30);
  EXPECT_EQ(c.n_heads, 9);
  EXPECT_EQ(c.n_kv_heads, 3);
  EXPECT_EQ(c.hidden_dim, 1536);
  EXPECT_EQ(c.n_ctx_train, 8192);
  EXPECT_FLOAT_EQ(c.rope_base, 100000.0f);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-5f);
  const Weights w = load_weights(*f, c);
  EXPECT_EQ(w.layers.size(), 30u);
  EXPECT_EQ(w.output.data, w.token_embd.data);  // tied lm_head
}

TEST(Synth, SmolLM360MPreset) {
  // Generating 362 M weights takes seconds; the shapes come from the preset table, checked here.
  const SynthPreset& p = synth_preset("smollm-360m");
  EXPECT_EQ(p.dim, 960);
  EXPECT_EQ(p.n_layers, 32);
  EXPECT_EQ(p.n_heads, 15);
  EXPECT_EQ(p.n_kv_heads, 5);
  EXPECT_EQ(p.hidden_dim, 2560);
  EXPECT_EQ(p.vocab_size, 49152);
  EXPECT_EQ(synth_presets().size(), 11u);  // 5 llama ones, 3 real family shapes, 3 tiny family ones
}

uint64_t params_of(const std::vector<TensorShape>& t) {
  uint64_t n = 0;
  for (const TensorShape& s : t) n += s.ne[0] * s.ne[1];
  return n;
}

TEST(Synth, SmolLM2_360MPresetShapes) {
  // HuggingFaceTB/SmolLM2-360M: 361,821,120 parameters with the tied embedding counted once.
  const SynthPreset& p = synth_preset("smollm2-360m");
  EXPECT_EQ(p.dim, 960);
  EXPECT_EQ(p.hidden_dim, 2560);
  EXPECT_EQ(p.n_layers, 32);
  EXPECT_EQ(p.n_heads, 15);
  EXPECT_EQ(p.n_kv_heads, 5);
  EXPECT_EQ(p.vocab_size, 49152);
  EXPECT_EQ(p.n_ctx, 8192);
  EXPECT_FLOAT_EQ(p.rope_base, 100000.0f);
  const std::vector<TensorShape> t = synth_tensors(p, 49152);
  EXPECT_EQ(t.size(), 32u * 9u + 2u);
  EXPECT_EQ(params_of(t), 361821120u);
  // q4_k_m: 960 columns fall back to Q5_0 (Q8_0 for the Q6_K picks); ffn_down (2560) keeps K.
  const std::vector<TensorPlan> plan = plan_model(t, parse_quant_target("q4_k_m"));
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i].name == "blk.0.attn_k.weight") {
      EXPECT_EQ(t[i].ne[1], 320u);  // 5 KV heads x 64
      EXPECT_EQ(plan[i].type, GgmlType::Q5_0);
    }
    if (t[i].name == "blk.0.ffn_down.weight") {
      EXPECT_EQ(plan[i].type, GgmlType::Q6_K);
    }
    if (t[i].name == "blk.5.ffn_down.weight") {  // use_more_bits(5, 32) is false
      EXPECT_EQ(plan[i].type, GgmlType::Q4_K);
    }
    if (t[i].name == "token_embd.weight") {
      EXPECT_EQ(plan[i].type, GgmlType::Q8_0);
    }
  }
}

TEST(Synth, SmolLM2_1_7BPresetShapes) {
  // Not generated here (1.7 B weights): the preset table, the tensor list and the plan only.
  // HuggingFaceTB/SmolLM2-1.7B: 1,711,376,384 parameters (tied embedding counted once).
  const SynthPreset& p = synth_preset("smollm2-1.7b");
  EXPECT_EQ(p.dim, 2048);
  EXPECT_EQ(p.hidden_dim, 8192);
  EXPECT_EQ(p.n_layers, 24);
  EXPECT_EQ(p.n_heads, 32);
  EXPECT_EQ(p.n_kv_heads, 32);
  EXPECT_EQ(p.vocab_size, 49152);
  EXPECT_EQ(p.n_ctx, 8192);
  EXPECT_FLOAT_EQ(p.rope_base, 130000.0f);
  EXPECT_EQ(p.dim / p.n_heads, 64);
  const std::vector<TensorShape> t = synth_tensors(p, 49152);
  EXPECT_EQ(t.size(), 24u * 9u + 2u);
  EXPECT_EQ(params_of(t), 1711376384u);
  for (const TensorShape& s : t) {
    if (s.name == "blk.5.attn_k.weight") {
      EXPECT_EQ(s.ne[1], 2048u);  // no grouping
    }
    if (s.name == "blk.5.ffn_down.weight") {
      EXPECT_EQ(s.ne[0], 8192u);
    }
  }
  // Every row length is whole super-blocks: q4_k_m needs no fall-back.
  for (const TensorPlan& tp : plan_model(t, parse_quant_target("q4_k_m"))) {
    EXPECT_TRUE(tp.note.empty()) << tp.note;
  }
}

TEST(Synth, EveryTargetGivesALoadableTinyModel) {
  for (const char* name : {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k",
                           "q5_k", "q6_k", "q4_k_s", "q4_k_m", "q5_k_s", "q5_k_m"}) {
    SynthOptions o;
    o.preset = "tiny";
    o.type = parse_quant_target(name);
    std::vector<uint8_t> bytes;
    auto f = synth_file(o, &bytes);
    EXPECT_EQ(f->get_uint("general.file_type"), llama_file_type(o.type)) << name;
    const ModelConfig c = load_config(*f);
    EXPECT_NO_THROW(load_weights(*f, c)) << name;
  }
}

TEST(Synth, WeightStatisticsLookTrained) {
  SynthOptions o;
  o.preset = "tiny";
  o.type = GgmlType::F32;
  auto f = synth_file(o, nullptr);
  // Matrices ~ N(0, 0.02): check mean, std and the one-sigma mass over all matrices.
  double s = 0, s2 = 0, within = 0, within2 = 0, n = 0;
  for (const auto& t : f->tensors()) {
    if (t.n_dims != 2) continue;
    ASSERT_EQ(t.type, GgmlType::F32);
    const float* x = reinterpret_cast<const float*>(t.data);
    for (uint64_t i = 0; i < t.n_elements(); ++i) {
      s += x[i], s2 += double(x[i]) * x[i], n += 1;
      within += std::fabs(x[i]) < 0.02f;
      within2 += std::fabs(x[i]) < 0.04f;
    }
  }
  ASSERT_GT(n, 50000);
  const double mean = s / n, sd = std::sqrt(s2 / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.0005);
  EXPECT_NEAR(sd, 0.02, 0.0005);
  EXPECT_NEAR(within / n, 0.6827, 0.01);    // normal: 68.27% within 1 sigma
  EXPECT_NEAR(within2 / n, 0.9545, 0.005);  // and 95.45% within 2 sigma
  // Norm weights ~ 1 + N(0, 0.05).
  const auto* norm = f->find_tensor("output_norm.weight");
  ASSERT_NE(norm, nullptr);
  const float* g = reinterpret_cast<const float*>(norm->data);
  double gs = 0;
  for (uint64_t i = 0; i < norm->n_elements(); ++i) {
    EXPECT_GT(g[i], 0.7f);
    EXPECT_LT(g[i], 1.3f);
    gs += g[i];
  }
  EXPECT_NEAR(gs / norm->n_elements(), 1.0, 0.03);
}

TEST(Synth, TinyVocabMatchesEmbeddingRows) {
  SynthOptions o;
  o.preset = "tiny";
  auto f = synth_file(o, nullptr);
  const auto tokens = f->get_string_array("tokenizer.ggml.tokens");
  const auto* emb = f->find_tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->ne[1], tokens.size());
  EXPECT_EQ(f->get_uint("llama.vocab_size"), tokens.size());
  EXPECT_EQ(f->get_string("tokenizer.ggml.model"), "gpt2");
  // GPT-2 byte-to-unicode: byte b is token 3 + b; space -> "Ġ", newline -> "Ċ", 'A' -> "A".
  ASSERT_GE(tokens.size(), 259u);
  EXPECT_EQ(tokens[3 + ' '], "\xC4\xA0");
  EXPECT_EQ(tokens[3 + '\n'], "\xC4\x8A");
  EXPECT_EQ(tokens[3 + 'A'], "A");
  EXPECT_EQ(tokens[3 + 0xff], "\xC3\xBF");
  EXPECT_EQ(tokens[1], "<|im_start|>");
  const ModelConfig c = load_config(*f);
  EXPECT_EQ(c.vocab_size, static_cast<int>(tokens.size()));
  EXPECT_NO_THROW(load_weights(*f, c));
}

TEST(Synth, BuiltinVocabRoundTripsThroughGguf) {
  SynthOptions o;
  o.preset = "tiny";
  auto f = synth_file(o, nullptr);
  const VocabData want = builtin_byte_vocab();
  const VocabData got = vocab_from_gguf(*f);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.merges, want.merges);
  EXPECT_EQ(got.bos, 1);
  EXPECT_EQ(got.eos, 2);
  Tokenizer tok(got);
  const std::string text = "the cat in the hat\n\nsings";
  const std::vector<int> ids = tok.encode(text, true, 0);
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_LT(ids.size(), text.size());  // the merges fired
}

TEST(Synth, WithHfTokenizer) {
  REQUIRE_FIXTURE(tj, "tokenizers/smollm2-135m/tokenizer.json");
  SynthOptions o;
  o.preset = "tiny";
  o.tokenizer_json = tj.string();
  auto f = synth_file(o, nullptr);
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens").size(), 49152u);
  EXPECT_EQ(f->find_tensor("token_embd.weight")->ne[1], 49152u);
  EXPECT_EQ(f->get_string("tokenizer.ggml.pre"), "smollm");
}

TEST(Synth, BadOptions) {
  SynthOptions o;
  o.preset = "gpt-5";
  try {
    synth_model(o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown preset 'gpt-5'"), std::string::npos);
  }
  o.preset = "tiny";
  o.type = GgmlType::Q3_K;  // not a target smolrt can write
  EXPECT_THROW(synth_model(o), Error);
  o.type = GgmlType::Q4_0;
  o.tokenizer_json = "/nonexistent/tokenizer.json";
  EXPECT_THROW(synth_model(o), Error);
}

}  // namespace
}  // namespace smolrt
