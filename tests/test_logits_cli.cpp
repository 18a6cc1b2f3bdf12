// `smolrt logits` end to end through the binary: the JSON layout, ids vs text input, every
// position vs the last, and its error paths (bad ids, empty prompt, missing input).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace smolrt {
namespace {

using test::Proc;

Proc logits(const std::vector<std::string>& args) {
  return test::run_subcommand("logits", args);
}

TEST(LogitsCli, JsonLastAndAllPositions) {
  REQUIRE_FIXTURE(model, "models/stories260K.gguf");
  const std::string m = model.string();
  const Proc last = logits({"-m", m, "--ids", "1, 403,407", "--backend", "cpu-ref", "--json"});
  ASSERT_EQ(last.rc, 0) << last.err;
  const nlohmann::json j = nlohmann::json::parse(last.out);
  EXPECT_EQ(j["backend"], "cpu-ref");
  EXPECT_EQ(j["vocab_size"], 512);
  EXPECT_EQ(j["ids"].get<std::vector<int>>(), (std::vector<int>{1, 403, 407}));
  EXPECT_EQ(j["positions"].get<std::vector<int>>(), std::vector<int>{2});
  ASSERT_EQ(j["logits"].size(), 1u);
  ASSERT_EQ(j["logits"][0].size(), 512u);

  const Proc all =
      logits({"-m", m, "--ids", "1,403,407", "--backend", "cpu-ref", "--all-positions", "--json"});
  ASSERT_EQ(all.rc, 0) << all.err;
  const nlohmann::json a = nlohmann::json::parse(all.out);
  EXPECT_EQ(a["positions"].get<std::vector<int>>(), (std::vector<int>{0, 1, 2}));
  ASSERT_EQ(a["logits"].size(), 3u);
  // The same CPU computation either way, printed exactly: the last rows are equal.
  EXPECT_EQ(a["logits"][2].get<std::vector<float>>(), j["logits"][0].get<std::vector<float>>());
  EXPECT_NE(a["logits"][0].get<std::vector<float>>(), a["logits"][2].get<std::vector<float>>());
}

TEST(LogitsCli, PromptIsTokenizedLikeRun) {
  REQUIRE_FIXTURE(model, "models/stories260K.gguf");
  const Proc p =
      logits({"-m", model.string(), "-p", "Once upon a time", "--backend", "cpu-ref", "--json"});
  ASSERT_EQ(p.rc, 0) << p.err;
  const nlohmann::json j = nlohmann::json::parse(p.out);
  EXPECT_EQ(j["ids"].get<std::vector<int>>(), (std::vector<int>{1, 403, 407, 261, 378}));
  // Greedy `smolrt run` continues "Once upon a time" with 432 (test_cpu_run_cli.cpp).
  const auto row = j["logits"][0].get<std::vector<float>>();
  EXPECT_EQ(std::max_element(row.begin(), row.end()) - row.begin(), 432);
  const Proc text =
      logits({"-m", model.string(), "-p", "Once upon a time", "--backend", "cpu-ref"});
  ASSERT_EQ(text.rc, 0) << text.err;
  EXPECT_NE(text.out.find("ids: 1 403 407 261 378"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("top 432:"), std::string::npos) << text.out;
}

TEST(LogitsCli, BadInputsExitNonZeroWithOneMessage) {
  REQUIRE_FIXTURE(model, "models/stories260K.gguf");
  const std::string m = model.string();
  struct Case {
    std::vector<std::string> args;
    const char* must_mention;
  };
  const std::vector<Case> cases = {
      {{"-m", m, "--ids", "1,x,3"}, "'x' is not a token id"},
      {{"-m", m, "--ids", "1,,3"}, "item 1 is empty"},
      {{"-m", m, "--ids", "1,2,"}, "item 2 is empty"},
      {{"-m", m, "--ids", "1.5"}, "'1.5' is not a token id"},
      {{"-m", m, "--ids", "99999999999999999999"}, "is not a token id"},
      {{"-m", m, "--ids", "-1"}, "token id -1 is out of range"},
      {{"-m", m, "--ids", "1,512"},
       "token id 512 is out of range; this model's vocabulary has 512"},
      {{"-m", m, "--ids", ""}, "--ids is empty"},
      {{"-m", m, "--ids", " "}, "--ids is empty"},
      {{"-m", m, "-p", ""}, "the prompt given with -p is empty"},
      {{"-m", m}, "give the input as token ids"},
      {{"-m", m, "--ids", "1", "-p", "hi"}, "excludes"},
      {{"-m", m, "--ids", "1,2,3", "--ctx", "2", "--backend", "cpu"}, "context"},
      {{"-m", m, "--ids", "1", "--backend", "tpu"}, "backend"},
      {{"-m", "/nonexistent/model.gguf", "--ids", "1"}, "does not exist"},
  };
  for (const Case& c : cases) {
    const Proc p = logits(c.args);
    std::string shown;
    for (const auto& a : c.args) shown += "'" + a + "' ";
    EXPECT_NE(p.rc, 0) << shown;
    EXPECT_NE(p.rc, 2) << shown << ": internal error, not a clear message: " << p.err;
    EXPECT_NE(p.err.find(c.must_mention), std::string::npos) << shown << "\n" << p.err;
    EXPECT_TRUE(p.out.empty()) << shown << ": " << p.out;
  }
}

}  // namespace
}  // namespace smolrt
