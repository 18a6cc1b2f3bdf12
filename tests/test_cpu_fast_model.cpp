// The fast CPU path (--backend cpu) against the fp32 oracle (cpu-ref) on whole models: every
// family the oracle supports (llama, qwen2, gemma3 and their switches), every SIMD level this CPU
// runs, stories260K (F32: the float path) and, when fetched, the real SmolLM2-135M (Q4_0, Q4_K_M)
// and gemma-3-270m (Q4_K_M). Compared: the logits of every prompt position (relative L2) and
// greedy decoding. The bounds are what int8 activations cost (measured figures beside each).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "backend/backend.h"
#include "backend/cpu/fast/isa.h"
#include "backend/cpu/ops.h"
#include "core/paths.h"
#include "model/model.h"
#include "model/quantize_model.h"
#include "model/synth.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace smolrt {
namespace {

struct Agreement {
  double worst_rel_l2 = 0;  // over every prompt position
  int greedy_same = 0;      // leading generated tokens that agree
};

double rel_l2(std::span<const float> got, std::span<const float> want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

std::vector<int> greedy(Backend& be, const std::vector<int>& prompt, int n) {
  std::span<const float> l = be.forward_prompt(prompt);
  std::vector<int> out{cpu::argmax(l.data(), static_cast<int>(l.size()))};
  while (static_cast<int>(out.size()) < n)
    out.push_back(be.forward_token_greedy(out.back(), be.position()));
  return out;
}

Agreement compare(const Model& m, const std::vector<int>& prompt, int n_gen, int n_ctx) {
  auto ref = make_cpu_backend(m, BackendOptions{"cpu-ref", n_ctx, 2});
  auto fast = make_cpu_backend(m, BackendOptions{"cpu", n_ctx, 2});
  EXPECT_EQ(fast->name(), "cpu");
  const size_t vocab = size_t(m.config.vocab_size);
  const std::vector<float> want = ref->forward_prompt_all(prompt);
  const std::vector<float> got = fast->forward_prompt_all(prompt);
  Agreement a;
  for (size_t p = 0; p < prompt.size(); ++p) {
    const std::span<const float> w(want.data() + p * vocab, vocab),
        g(got.data() + p * vocab, vocab);
    for (float v : g) EXPECT_TRUE(std::isfinite(v));
    a.worst_rel_l2 = std::max(a.worst_rel_l2, rel_l2(g, w));
  }
  ref->reset();
  fast->reset();
  const std::vector<int> gr = greedy(*ref, prompt, n_gen), gf = greedy(*fast, prompt, n_gen);
  while (a.greedy_same < n_gen && gr[size_t(a.greedy_same)] == gf[size_t(a.greedy_same)])
    ++a.greedy_same;
  return a;
}

// Sets SMOLRT_CPU_ISA for its lifetime (the fast backend reads it when it is built).
struct ForceIsa {
  explicit ForceIsa(cpu::Isa i) { ::setenv("SMOLRT_CPU_ISA", cpu::isa_name(i), 1); }
  ~ForceIsa() { ::unsetenv("SMOLRT_CPU_ISA"); }
};

std::vector<int> some_ids(int n, int vocab, uint32_t seed) {
  std::vector<int> ids{1};
  for (uint32_t s = seed; static_cast<int>(ids.size()) < n;) {
    s = s * 1664525u + 1013904223u;
    ids.push_back(static_cast<int>((s >> 8) % uint32_t(vocab)));
  }
  return ids;
}

// stories260K is F32 throughout (the float path: no activation rounding) with head_dim 8 and
// hidden_dim 172 (tails under every SIMD width): ~1e-6 from the oracle, the same greedy text.
TEST(FastModel, Stories260KEveryLevel) {
  REQUIRE_FIXTURE(path, "models/stories260K.gguf");
  const Model m = load_model(path.string());
  const std::vector<int> prompt = {1, 403, 407, 261, 378};  // "Once upon a time"
  for (cpu::Isa isa : cpu::supported_isas()) {
    ForceIsa force(isa);
    const Agreement a = compare(m, prompt, 48, 128);
    EXPECT_LT(a.worst_rel_l2, 2e-5) << cpu::isa_name(isa);
    EXPECT_EQ(a.greedy_same, 48) << cpu::isa_name(isa);
  }
}

// Each family's tiny synth preset (random weights) in every format: logits within the int8
// activations' error at every position, at the best SIMD level (and at every level for q4_k_m,
// whose mixture runs Q4_K, Q6_K and Q5_0/Q8_0 fallbacks together; the kernel tests cover each level
// and format alone).
class FastSynth : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(FastSynth, LogitsNearOracle) {
  const auto [preset, type] = GetParam();
  SynthOptions o;
  o.preset = preset;
  o.type = parse_quant_target(type);
  o.seed = 5;
  Model m;
  m.file = gguf::File::parse(synth_model(o).writer.to_bytes(), preset);
  m.config = load_config(*m.file);
  m.weights = load_weights(*m.file, m.config);
  const std::vector<int> prompt = some_ids(24, m.config.vocab_size, 3);
  const std::vector<cpu::Isa> levels =
      type == "q4_k_m" ? cpu::supported_isas() : std::vector<cpu::Isa>{cpu::choose_isa()};
  for (cpu::Isa isa : levels) {
    ForceIsa force(isa);
    const Agreement a = compare(m, prompt, 4, 64);
    EXPECT_LT(a.worst_rel_l2, 3e-2) << cpu::isa_name(isa);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Families, FastSynth,
    ::testing::Combine(::testing::Values("tiny", "tiny-qwen2", "tiny-llama3", "tiny-gemma3"),
                       ::testing::Values("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k_m", "q5_k_m",
                                         "q6_k", "f16", "bf16")),
    [](const ::testing::TestParamInfo<std::tuple<std::string, std::string>>& p) {
      std::string s = std::get<0>(p.param) + "_" + std::get<1>(p.param);
      std::replace(s.begin(), s.end(), '-', '_');
      return s;
    });

// The real models (skipped visibly when not fetched): 24 greedy tokens identical to the oracle's,
// and a chat prompt's logits near the oracle's at every position. The int8 rounding of every
// matmul input compounds over the layers' residual stream: measured per position 1% to 9% relative
// L2 (SmolLM2 Q4_0), up to 11% (Q4_K_M), up to 4% (gemma-3-270m); the bound is 15%.
void check_real(const std::filesystem::path& path, const std::string& prompt_text) {
  const Model m = load_model(path.string());
  const Tokenizer tok(vocab_from_gguf(*m.file));
  const std::vector<int> prompt = tok.encode(prompt_text, true, -1);
  const Agreement a = compare(m, prompt, 24, 256);
  EXPECT_LT(a.worst_rel_l2, 0.15) << path;
  EXPECT_EQ(a.greedy_same, 24) << path;
}

const char* kChat =
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";

TEST(FastModel, RealSmolLM2Q4_0) {
  REQUIRE_DEFAULT_MODEL(path);
  check_real(path, kChat);
}

TEST(FastModel, RealSmolLM2Q4_K_M) {
  const std::filesystem::path path = cache_dir() / "SmolLM2-135M-Instruct.Q4_K_M.gguf";
  if (!std::filesystem::exists(path))
    GTEST_SKIP() << "skipped: " << path << " not found; run scripts/fetch_model.sh";
  check_real(path, kChat);
}

TEST(FastModel, RealGemma3_270mQ4_K_M) {
  const std::filesystem::path path = cache_dir() / "gemma-3-270m-q4_k_m.gguf";
  if (!std::filesystem::exists(path))
    GTEST_SKIP() << "skipped: " << path << " not found; run scripts/fetch_model.sh gemma3-270m";
  check_real(path, "The capital of France is Paris. The capital of Germany is");
}

}  // namespace
}  // namespace smolrt
