// Golden end-to-end checks of the CPU backend on real models: stories260K against llama.cpp's
// numbers, and SmolLM2-135M-Instruct (Q4_1 as shipped, Q4_0 requantized) with frozen greedy
// sequences and a bounded Q4_0-vs-Q4_1 logit difference.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/backend.h"
#include "backend/cpu/ops.h"
#include "model/model.h"
#include "runtime/generator.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace smolrt {
namespace {

struct Loaded {
  Model model;
  Tokenizer tok;
  std::unique_ptr<Backend> be;
};

Loaded load(const std::filesystem::path& p, int n_ctx = 512) {
  Model m = load_model(p.string());
  Tokenizer t(vocab_from_gguf(*m.file));
  auto be = make_cpu_backend(m, BackendOptions{"cpu", n_ctx, 0});
  return Loaded{std::move(m), std::move(t), std::move(be)};
}

// --- stories260K vs llama.cpp --------------------------------------------------------------------

const std::vector<int> kStoriesGreedy64 = {
    432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337,
    410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394,
    261, 370, 432, 352, 266, 268, 388, 426, 338, 391, 266, 267, 337, 335, 312, 432,
    398, 312, 286, 267, 414, 270, 333, 415, 426, 13,  438, 310, 439, 419, 357, 336};

TEST(CpuGolden, Stories260KMatchesLlamaCpp) {
  REQUIRE_FIXTURE(path, "models/stories260K.gguf");
  Loaded l = load(path);
  Generator gen(*l.be, l.tok);
  const std::vector<int> prompt = gen.tokenize_prompt("Once upon a time");
  ASSERT_EQ(prompt, (std::vector<int>{1, 403, 407, 261, 378}));

  const auto logits = l.be->forward_prompt(prompt);
  const int top = cpu::argmax(logits.data(), static_cast<int>(logits.size()));
  EXPECT_EQ(top, 432);
  EXPECT_NEAR(logits[top], 17.7989f, 2e-3f);  // llama.cpp's value, printed to 4 decimals

  // The last row of forward_prompt_all is the same logits.
  l.be->reset();
  const std::vector<float> all = l.be->forward_prompt_all(prompt);
  ASSERT_EQ(all.size(), prompt.size() * logits.size());
  EXPECT_EQ(all[all.size() - logits.size() + top], logits[top]);

  GenerateOptions go;
  go.max_tokens = 64;
  std::string streamed;
  const GenerateResult r = gen.generate(prompt, go, [&](std::string_view s) { streamed += s; });
  EXPECT_EQ(r.generated_ids, kStoriesGreedy64);
  EXPECT_EQ(r.stop, StopReason::kMaxTokens);
  EXPECT_EQ(r.n_decode_steps, 63);
  EXPECT_EQ(streamed, r.text);
  EXPECT_EQ(r.text, l.tok.decode(kStoriesGreedy64));
  EXPECT_GT(r.prefill_tok_s(), 0);
  EXPECT_GT(r.decode_tok_s(), 0);
}

TEST(CpuGolden, Stories260KGeneratorStopsAtContextAndEmptyPromptIsBos) {
  REQUIRE_FIXTURE(path, "models/stories260K.gguf");
  Loaded l = load(path, 8);
  Generator gen(*l.be, l.tok);
  // Empty prompt: BOS alone (the SPM vocab has one).
  const std::vector<int> empty = gen.tokenize_prompt("");
  ASSERT_EQ(empty, (std::vector<int>{l.tok.vocab().bos}));
  GenerateOptions go;
  go.max_tokens = 100;
  // 5 prompt tokens in an 8-token context: 3 decode steps fill it, 4 tokens come out.
  const std::vector<int> prompt = {1, 403, 407, 261, 378};
  const GenerateResult r = gen.generate(prompt, go);
  EXPECT_EQ(r.stop, StopReason::kContextFull);
  EXPECT_EQ(r.generated_ids,
            std::vector<int>(kStoriesGreedy64.begin(), kStoriesGreedy64.begin() + 4));
  EXPECT_EQ(l.be->position(), 8);
  // A prompt longer than the context is an Error, not a crash.
  EXPECT_THROW(gen.generate(std::vector<int>(9, 1), go), Error);
  go.max_tokens = -1;
  EXPECT_THROW(gen.generate(prompt, go), Error);
  // -n 0: prefill only.
  go.max_tokens = 0;
  EXPECT_TRUE(gen.generate(prompt, go).generated_ids.empty());
  // A pluggable sampler sees the logits and its choice is used.
  go.max_tokens = 3;
  int calls = 0;
  go.sampler = [&](std::span<const float> lg) {
    EXPECT_EQ(lg.size(), 512u);
    ++calls;
    return 13;
  };
  EXPECT_EQ(gen.generate(prompt, go).generated_ids, (std::vector<int>{13, 13, 13}));
  EXPECT_EQ(calls, 3);
}

// --- SmolLM2-135M-Instruct
// ------------------------------------------------------------------------

const char* kChatPrompt =
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";

// Frozen greedy continuations (32 tokens, CPU backend) of kChatPrompt.
const std::vector<int> kQ41Greedy32 = {};
const std::vector<int> kQ40Greedy32 = {};

GenerateResult chat_greedy(Loaded& l, int n) {
  Generator gen(*l.be, l.tok);
  GenerateOptions go;
  go.max_tokens = n;
  return gen.generate(gen.tokenize_prompt(kChatPrompt), go);
}

void print_ids(const char* what, const std::vector<int>& ids) {
  std::string s;
  for (int id : ids) s += std::to_string(id) + ",";
  std::printf("%s: {%s}\n", what, s.c_str());
}

TEST(CpuGolden, SmolLM2Q4_1AnswersParis) {
  REQUIRE_DEFAULT_MODEL_Q4_1(path);
  Loaded l = load(path);
  const GenerateResult r = chat_greedy(l, 32);
  print_ids("q4_1 greedy", r.generated_ids);
  std::printf("q4_1 text: %s\n", r.text.c_str());
  EXPECT_NE(r.text.find("Paris"), std::string::npos) << r.text;
  EXPECT_EQ(r.generated_ids, kQ41Greedy32);
}

TEST(CpuGolden, SmolLM2Q4_0AnswersParis) {
  REQUIRE_DEFAULT_MODEL(path);
  Loaded l = load(path);
  const GenerateResult r = chat_greedy(l, 32);
  print_ids("q4_0 greedy", r.generated_ids);
  std::printf("q4_0 text: %s\n", r.text.c_str());
  EXPECT_NE(r.text.find("Paris"), std::string::npos) << r.text;
  EXPECT_EQ(r.generated_ids, kQ40Greedy32);
}

TEST(CpuGolden, SmolLM2Q4_0CloseToQ4_1) {
  REQUIRE_DEFAULT_MODEL_Q4_1(p41);
  REQUIRE_DEFAULT_MODEL(p40);
  Loaded a = load(p41), b = load(p40);
  Generator gen(*a.be, a.tok);
  const std::vector<int> prompt = gen.tokenize_prompt(kChatPrompt);
  const std::vector<float> la = a.be->forward_prompt_all(prompt);
  const std::vector<float> lb = b.be->forward_prompt_all(prompt);
  ASSERT_EQ(la.size(), lb.size());
  const size_t vocab = 49152;
  double max_diff = 0, sum_diff = 0, max_abs = 0;
  for (size_t i = 0; i < la.size(); ++i) {
    const double d = std::fabs(la[i] - lb[i]);
    max_diff = std::max(max_diff, d);
    sum_diff += d;
    max_abs = std::max(max_abs, double(std::fabs(la[i])));
  }
  const size_t last = la.size() - vocab;
  const int top_a = cpu::argmax(la.data() + last, vocab),
            top_b = cpu::argmax(lb.data() + last, vocab);
  std::printf(
      "q4_0 vs q4_1 over %zu positions: max |diff| %.4f, mean |diff| %.4f, max |logit| %.3f, top "
      "%d vs %d\n",
      prompt.size(), max_diff, sum_diff / la.size(), max_abs, top_a, top_b);
  EXPECT_EQ(top_a, top_b);
  EXPECT_LT(max_diff, 1e9);
  EXPECT_LT(sum_diff / la.size(), 1e9);
}

}  // namespace
}  // namespace smolrt
