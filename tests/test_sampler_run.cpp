// `smolrt run` with the sampling flags: --temp 0 is greedy, a seed reproduces, --stop cuts the
// text across tokens, bad values are clear errors naming the flag. The generator's stop strings.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "backend/backend.h"
#include "model/model.h"
#include "runtime/generator.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace smolrt {
namespace {

using test::Proc;

Proc run(const std::vector<std::string>& args) {
  return test::run_subcommand("run", args);
}

std::vector<std::string> base(const std::string& model) {
  return {"-m", model, "-p", "Once upon a time", "-n", "24", "--backend", "cpu", "--json"};
}

nlohmann::json json_of(const Proc& p) {
  EXPECT_EQ(p.rc, 0) << p.err;
  return nlohmann::json::parse(p.out);
}

TEST(SamplerRun, TempZeroIsGreedyAndASeedReproduces) {
  REQUIRE_FIXTURE(model, "models/stories260K.gguf");
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base(model.string());
    a.insert(a.end(), extra.begin(), extra.end());
    return json_of(run(a));
  };
  const auto greedy = with({"--temp", "0"});
  // Greedy with --temp 0 whatever the seed: the same ids.
  EXPECT_EQ(greedy["generated_ids"], with({"--temp", "0", "--seed", "5"})["generated_ids"]);
  const auto a =
      with({"--temp", "1.5", "--top-k", "0", "--top-p", "1", "--min-p", "0", "--seed", "1234"});
  EXPECT_EQ(a["seed"], 1234);
  EXPECT_EQ(a["generated_ids"], with({"--temp", "1.5", "--top-k", "0", "--top-p", "1", "--min-p",
                                      "0", "--seed", "1234"})["generated_ids"]);
  // A hot, unfiltered distribution over 24 tokens: another seed or greedy gives other tokens.
  EXPECT_NE(a["generated_ids"], with({"--temp", "1.5", "--top-k", "0", "--top-p", "1", "--min-p",
                                      "0", "--seed", "4321"})["generated_ids"]);
  EXPECT_NE(a["generated_ids"], greedy["generated_ids"]);
  // A strong repetition penalty changes greedy output (stories repeat names).
  EXPECT_NE(greedy["generated_ids"], with({"--temp", "0", "--repeat-penalty", "3",
                                           "--repeat-last-n", "64"})["generated_ids"]);
}

TEST(SamplerRun, StopStringCutsTheTextAndTheStream) {
  REQUIRE_FIXTURE(model, "models/stories260K.gguf");
  std::vector<std::string> a = base(model.string());
  a.insert(a.end(), {"--temp", "0"});
  const std::string full = json_of(run(a))["text"];
  ASSERT_GE(full.size(), 20u) << full;
  const std::string stop_str = full.substr(full.size() / 2 - 2, 4);
  const size_t at = full.find(stop_str);
  a.insert(a.end(), {"--stop", "never-there", "--stop", stop_str});
  const auto j = json_of(run(a));
  EXPECT_EQ(j["text"], full.substr(0, at));
  EXPECT_EQ(j["stop_reason"], "stop");
  // Streaming mode prints exactly the cut text.
  a.erase(std::find(a.begin(), a.end(), "--json"));
  const Proc p = run(a);
  ASSERT_EQ(p.rc, 0) << p.err;
  EXPECT_EQ(p.out, full.substr(0, at) + "\n");
}

TEST(SamplerRun, BadSamplingValuesNameTheFlag) {
  REQUIRE_FIXTURE(model, "models/stories260K.gguf");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--temp", "-0.5"}, "--temp"},
      {{"--top-k", "-1"}, "--top-k"},
      {{"--top-p", "0"}, "--top-p"},
      {{"--top-p", "1.2"}, "--top-p"},
      {{"--min-p", "-0.1"}, "--min-p"},
      {{"--min-p", "1.5"}, "--min-p"},
      {{"--repeat-penalty", "0"}, "--repeat-penalty"},
      {{"--repeat-last-n", "-7"}, "--repeat-last-n"},
      {{"--seed", "-9"}, "--seed"},
  };
  for (const auto& [extra, flag] : cases) {
    std::vector<std::string> a = base(model.string());
    a.insert(a.end(), extra.begin(), extra.end());
    const Proc p = run(a);
    EXPECT_EQ(p.rc, 1) << flag << ": " << p.err;
    EXPECT_NE(p.err.find(flag), std::string::npos) << p.err;
    EXPECT_TRUE(p.out.empty()) << p.out;
  }
}

// The generator through the Backend seam: a greedy TokenSampler (penalties off) gives exactly
// the argmax path's tokens, so the seam adds nothing to greedy decoding.
TEST(SamplerRun, GeneratorSeamGreedyEqualsArgmaxPath) {
  REQUIRE_FIXTURE(path, "models/stories260K.gguf");
  const Model m = load_model(path.string());
  const Tokenizer tok(vocab_from_gguf(*m.file));
  BackendOptions bo;
  bo.kind = "cpu";
  bo.n_ctx = 128;
  auto be = make_backend(m, bo);
  Generator gen(*be, tok);
  const std::vector<int> prompt = gen.tokenize_prompt("Once upon a time");
  GenerateOptions plain;
  plain.max_tokens = 20;
  const GenerateResult a = gen.generate(prompt, plain);
  SamplingParams p;
  p.temp = 0.0f;
  TokenSampler ts(p);
  GenerateOptions seam = plain;
  seam.token_sampler = &ts;
  const GenerateResult b = gen.generate(prompt, seam);
  EXPECT_EQ(a.generated_ids, b.generated_ids);
  EXPECT_EQ(a.text, b.text);
}

}  // namespace
}  // namespace smolrt
