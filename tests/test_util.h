// Shared test helpers: fixture lookup that skips visibly, random data, poisoning.
#pragma once

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/paths.h"
#include "gguf/gguf.h"
#include "quant/format.h"
#include "tokenizer/tokenizer.h"

namespace smolrt::test {

// Path of a file under ../shared (or $SMOLRT_FIXTURES); empty when absent.
inline std::filesystem::path fixture(const std::string& rel) {
  std::filesystem::path p = fixtures_dir() / rel;
  return std::filesystem::exists(p) ? p : std::filesystem::path();
}

// Random floats ~ N(0, scale) from a fixed seed; never all zeros.
inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Every weight format smolrt computes (quant/format.h), in its order: the type list of the tests
// that cover each format.
inline std::vector<GgmlType> all_formats() {
  std::vector<GgmlType> v;
  for_each_format([&](auto f) { v.push_back(decltype(f)::kType); });
  return v;
}

// SmolLM2's tokenizer from the fixtures' tokenizer.json, loaded once; nullptr when absent.
inline const Tokenizer* smollm_tokenizer() {
  static std::unique_ptr<Tokenizer> tok;
  static bool tried = false;
  if (!tried) {
    tried = true;
    const std::filesystem::path p = fixture("tokenizers/smollm2-135m/tokenizer.json");
    if (!p.empty()) tok = std::make_unique<Tokenizer>(vocab_from_hf_json(p.string()));
  }
  return tok.get();
}

// The exact layout of a SmolLM-135M Q4_0 file (facts.md): 272 tensors, 210 Q4_0 layer matrices,
// a Q8_0 tied token_embd, 61 F32 norms, 134,515,008 parameters, 89,941,248 bytes of tensor data.
inline void expect_smollm135m_q4_0_layout(const gguf::File& f) {
  std::map<GgmlType, int> count;
  uint64_t params = 0, nbytes = 0;
  for (const auto& t : f.tensors()) {
    ++count[t.type];
    params += t.n_elements();
    nbytes += t.nbytes;
  }
  EXPECT_EQ(f.tensors().size(), 272u);
  EXPECT_EQ(count[GgmlType::Q4_0], 210);
  EXPECT_EQ(count[GgmlType::Q8_0], 1);
  EXPECT_EQ(count[GgmlType::F32], 61);
  EXPECT_EQ(params, 134515008u);
  EXPECT_EQ(nbytes, 89941248u);
  const gguf::TensorInfo* emb = f.find_tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->type, GgmlType::Q8_0);
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);  // tied
}

// --- running the smolrt binary (and other commands) ----------------------------------------------

struct Proc {
  int rc = -1;      // exit code; -1 when the command did not exit normally (signal)
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs a shell command line with `input` on stdin (empty: /dev/null), capturing stdout and stderr
// separately through temporary files.
inline Proc run_shell(const std::string& cmd, const std::string& input = "") {
  static std::atomic<int> counter{0};
  const std::filesystem::path dir = std::filesystem::temp_directory_path();
  const std::string tag = std::to_string(::getpid()) + "_" + std::to_string(counter++);
  const std::filesystem::path in = dir / ("smolrt_test_in_" + tag);
  const std::filesystem::path out = dir / ("smolrt_test_out_" + tag);
  const std::filesystem::path err = dir / ("smolrt_test_err_" + tag);
  std::ofstream(in, std::ios::binary) << input;
  const std::string full =
      "(" + cmd + ") <'" + in.string() + "' >'" + out.string() + "' 2>'" + err.string() + "'";
  const int st = std::system(full.c_str());
  auto slurp = [](const std::filesystem::path& f) {
    std::stringstream ss;
    ss << std::ifstream(f, std::ios::binary).rdbuf();
    return ss.str();
  };
  Proc p;
  p.rc = (st != -1 && WIFEXITED(st)) ? WEXITSTATUS(st) : -1;
  p.out = slurp(out);
  p.err = slurp(err);
  std::filesystem::remove(in);
  std::filesystem::remove(out);
  std::filesystem::remove(err);
  return p;
}

#if defined(SMOLRT_BINARY)
// `env smolrt args...`, every argument single-quoted (none may contain a single quote).
inline Proc run_smolrt(const std::vector<std::string>& args, const std::string& env = "",
                       const std::string& input = "") {
  std::string cmd = env + " '" + std::string(SMOLRT_BINARY) + "'";
  for (const std::string& a : args) cmd += " '" + a + "'";
  return run_shell(cmd, input);
}
// `env smolrt sub args...`.
inline Proc run_subcommand(const std::string& sub, std::vector<std::string> args,
                           const std::string& env = "") {
  args.insert(args.begin(), sub);
  return run_smolrt(args, env);
}
#endif

}  // namespace smolrt::test

// Skips the test (visibly, as "skipped: fixtures not found") when a ../shared file is missing.
#define REQUIRE_FIXTURE(var, rel)                                                                \
  const std::filesystem::path var = ::smolrt::test::fixture(rel);                                \
  if (var.empty())                                                                               \
  GTEST_SKIP() << "skipped: fixtures not found (" << (::smolrt::fixtures_dir() / (rel)).string() \
               << "); set SMOLRT_FIXTURES"

// Skips when the default model (scripts/fetch_model.sh) is not in the cache.
#define REQUIRE_DEFAULT_MODEL(var)                                     \
  const std::filesystem::path var = ::smolrt::default_model_path();    \
  if (!std::filesystem::exists(var))                                   \
  GTEST_SKIP() << "skipped: default model not found (" << var.string() \
               << "); run scripts/fetch_model.sh"

// Skips when the shipped Q4_1 SmolLM2-135M-Instruct (scripts/fetch_model.sh) is not in the cache.
#define REQUIRE_DEFAULT_MODEL_Q4_1(var)                                  \
  const std::filesystem::path var = ::smolrt::default_model_q4_1_path(); \
  if (!std::filesystem::exists(var))                                     \
  GTEST_SKIP() << "skipped: Q4_1 model not found (" << var.string()      \
               << "); run scripts/fetch_model.sh"
