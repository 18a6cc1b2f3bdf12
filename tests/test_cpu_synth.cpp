// A synthetic SmolLM-135M-shaped Q4_0 model (random weights, `smolrt synth`) runs end to end on the
// CPU backend: finite logits, deterministic output, identical across thread counts.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/backend.h"
#include "core/error.h"
#include "cpu_test_util.h"
#include "model/model.h"
#include "model/synth.h"
#include "runtime/generator.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace smolrt {
namespace {

TEST(CpuSynth, SmolLM135MQ4_0RunsEndToEnd) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("smolrt_cpu_synth_" + std::to_string(::getpid()) + ".gguf");
  {
    SynthOptions o;
    o.preset = "smollm-135m";
    o.type = GgmlType::Q4_0;
    o.seed = 7;
    SynthModel sm = synth_model(o);
    sm.writer.write(path.string());
  }
  const Model m = load_model(path.string());
  std::filesystem::remove(path);  // the mapping stays valid after unlink
  EXPECT_EQ(m.config.dim, 576);
  EXPECT_EQ(m.config.n_layers, 30);
  EXPECT_EQ(m.config.n_kv_heads, 3);
  EXPECT_TRUE(m.config.tied_output);
  EXPECT_EQ(m.weights.layers[0].wq.type, GgmlType::Q4_0);
  EXPECT_EQ(m.weights.token_embd.type, GgmlType::Q8_0);

  const Tokenizer tok(vocab_from_gguf(*m.file));
  auto a = make_cpu_backend(m, BackendOptions{"cpu-ref", 64, 2});
  auto b = make_cpu_backend(m, BackendOptions{"cpu-ref", 64, 1});
  const std::vector<int> prompt = tok.encode("Hello, world! 123", true, -1);
  ASSERT_FALSE(prompt.empty());

  const auto la = a->forward_prompt(prompt);
  const std::vector<float> first(la.begin(), la.end());
  ASSERT_EQ(first.size(), static_cast<size_t>(m.config.vocab_size));
  float lo = first[0], hi = first[0];
  for (float v : first) {
    ASSERT_TRUE(std::isfinite(v));
    lo = std::min(lo, v), hi = std::max(hi, v);
  }
  EXPECT_GT(hi - lo, 1e-3f);  // not a constant vector
  const auto lb = b->forward_prompt(prompt);
  EXPECT_EQ(std::vector<float>(lb.begin(), lb.end()), first);  // thread count changes nothing

  GenerateOptions go;
  go.max_tokens = 8;
  go.stop_at_eog = false;  // random weights: keep going whatever comes out
  Generator ga(*a, tok), gb(*b, tok);
  const GenerateResult r1 = ga.generate(prompt, go);
  const GenerateResult r2 = ga.generate(prompt, go);
  const GenerateResult r3 = gb.generate(prompt, go);
  EXPECT_EQ(r1.generated_ids.size(), 8u);
  EXPECT_EQ(r1.generated_ids, r2.generated_ids);
  EXPECT_EQ(r1.generated_ids, r3.generated_ids);
  EXPECT_EQ(r1.text, r2.text);
}

// Empty-prompt policy: [BOS] when the vocab has one, else an Error (nothing to condition on).
TEST(CpuSynth, EmptyPromptPolicy) {
  const auto tm = test::make_tiny_model({}, 3);
  auto be = make_cpu_backend(tm->model, BackendOptions{"cpu-ref", 0, 1});
  VocabData v = builtin_byte_vocab();
  v.bos = 1;
  const Tokenizer with_bos(v);
  EXPECT_EQ(Generator(*be, with_bos).tokenize_prompt(""), std::vector<int>{1});
  v.bos = -1;
  const Tokenizer no_bos(v);
  try {
    Generator(*be, no_bos).tokenize_prompt("");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("BOS"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(Generator(*be, no_bos).tokenize_prompt("hi").empty());
}

}  // namespace
}  // namespace smolrt
