// `smolrt run` end to end through the binary: output, --json, the default model, bad flags.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_util.h"

namespace smolrt {
namespace {

using test::Proc;

// `env smolrt run args...` (args single-quoted): stdout, stderr and the exit code.
Proc run_smolrt(const std::vector<std::string>& args, const std::string& env = "") {
  return test::run_subcommand("run", args, env);
}

// The oracle (cpu-ref) and the fast path (cpu) continue the prompt the same way.
TEST(CpuRunCli, JsonOnStories260K) {
  REQUIRE_FIXTURE(model, "models/stories260K.gguf");
  for (const std::string kind : {"cpu-ref", "cpu"}) {
    const Proc p = run_smolrt({"-m", model.string(), "-p", "Once upon a time", "-n", "8",
                               "--backend", kind, "--threads", "2", "--temp", "0", "--json"});
    ASSERT_EQ(p.rc, 0) << p.err;
    const nlohmann::json j = nlohmann::json::parse(p.out);
    EXPECT_EQ(j["prompt_ids"].get<std::vector<int>>(), (std::vector<int>{1, 403, 407, 261, 378}));
    EXPECT_EQ(j["generated_ids"].get<std::vector<int>>(),
              (std::vector<int>{432, 383, 286, 261, 376, 298, 315, 421}))
        << kind;
    EXPECT_EQ(j["backend"], kind);
    EXPECT_EQ(j["stop_reason"], "length");
    EXPECT_FALSE(j["text"].get<std::string>().empty());
    EXPECT_GT(j["decode_tok_s"].get<double>(), 0);
    EXPECT_NE(p.err.find("tok/s"), std::string::npos) << p.err;
  }
}

TEST(CpuRunCli, StreamsTextToStdout) {
  REQUIRE_FIXTURE(model, "models/stories260K.gguf");
  const Proc p = run_smolrt({"-m", model.string(), "-p", "Once upon a time", "-n", "16",
                             "--backend", "cpu", "--temp", "0"});
  ASSERT_EQ(p.rc, 0) << p.err;
  const Proc j = run_smolrt({"-m", model.string(), "-p", "Once upon a time", "-n", "16",
                             "--backend", "cpu", "--temp", "0", "--json"});
  ASSERT_EQ(j.rc, 0) << j.err;
  EXPECT_EQ(p.out, nlohmann::json::parse(j.out)["text"].get<std::string>() + "\n");
  EXPECT_NE(p.err.find("prefill"), std::string::npos) << p.err;
  EXPECT_NE(p.err.find("decode"), std::string::npos) << p.err;
}

TEST(CpuRunCli, EmptyPromptStartsFromBos) {
  REQUIRE_FIXTURE(model, "models/stories260K.gguf");
  const Proc p =
      run_smolrt({"-m", model.string(), "-p", "", "-n", "4", "--backend", "cpu", "--json"});
  ASSERT_EQ(p.rc, 0) << p.err;
  EXPECT_EQ(nlohmann::json::parse(p.out)["prompt_ids"].get<std::vector<int>>(),
            std::vector<int>{1});
}

TEST(CpuRunCli, BadInputsExitNonZeroWithOneMessage) {
  REQUIRE_FIXTURE(model, "models/stories260K.gguf");
  const std::string m = model.string();
  struct Case {
    std::vector<std::string> args;
    const char* must_mention;
  };
  const std::vector<Case> cases = {
      {{"-m", "/nonexistent/model.gguf", "-p", "hi"}, "does not exist"},
      {{"-m", m, "-p", "hi", "--ctx", "-3", "--backend", "cpu"}, "--ctx"},
      {{"-m", m, "-p", "hi", "--ctx", "999999", "--backend", "cpu"}, "--ctx"},
      {{"-m", m, "-p", "hi", "-n", "-5", "--backend", "cpu"}, "-n"},
      {{"-m", m, "-p", "hi", "--threads", "-1", "--backend", "cpu"}, "--threads"},
      {{"-m", m, "-p", "Once upon a time there was a dog", "--ctx", "4", "--backend", "cpu"},
       "context"},
      {{"-m", m, "-p", "hi", "--backend", "tpu"}, "backend"},
      {{"-m", m, "-p", "hi", "--bogus-flag"}, "bogus"},
      {{"-m", m, "-p", "hi", "-n", "abc"}, "abc"},
  };
  for (const Case& c : cases) {
    const Proc p = run_smolrt(c.args);
    std::string shown;
    for (const auto& a : c.args) shown += a + " ";
    EXPECT_NE(p.rc, 0) << shown;
    EXPECT_NE(p.rc, 2) << shown << ": internal error, not a clear message: " << p.err;
    EXPECT_NE(p.err.find(c.must_mention), std::string::npos) << shown << "\n" << p.err;
    EXPECT_TRUE(p.out.empty()) << shown << ": " << p.out;
  }
}

TEST(CpuRunCli, BadModelFileIsAnError) {
  const auto bad = std::filesystem::temp_directory_path() / "smolrt_cpu_cli_not_a_model.gguf";
  {
    std::ofstream f(bad, std::ios::binary);
    f << "this is not a gguf file at all";
  }
  const Proc p = run_smolrt({"-m", bad.string(), "-p", "hi", "--backend", "cpu"});
  std::filesystem::remove(bad);
  EXPECT_EQ(p.rc, 1) << p.err;
  EXPECT_NE(p.err.find("error"), std::string::npos) << p.err;
}

TEST(CpuRunCli, NoModelFlagUsesTheDefaultModel) {
  REQUIRE_DEFAULT_MODEL(def);
  const Proc p = run_smolrt(
      {"-p", "The capital of France is", "-n", "4", "--backend", "cpu", "--ctx", "64", "--json"});
  ASSERT_EQ(p.rc, 0) << p.err;
  const nlohmann::json j = nlohmann::json::parse(p.out);
  EXPECT_EQ(j["model"].get<std::string>(), def.string());
  EXPECT_EQ(j["generated_ids"].size(), 4u);
}

TEST(CpuRunCli, NoModelFlagWithoutDefaultSaysHowToFix) {
  const auto empty = std::filesystem::temp_directory_path() / "smolrt_cpu_cli_empty_cache";
  std::filesystem::create_directories(empty);
  const Proc p =
      run_smolrt({"-p", "hi"}, "env -u SMOLRT_MODEL SMOLRT_CACHE='" + empty.string() + "'");
  EXPECT_EQ(p.rc, 1) << p.err;
  EXPECT_NE(p.err.find("fetch_model.sh"), std::string::npos) << p.err;
}

}  // namespace
}  // namespace smolrt
