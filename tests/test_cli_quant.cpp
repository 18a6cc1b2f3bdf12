// The smolrt binary's quantize and synth commands: bad flags give one clear error and a non-zero
// exit; good ones write loadable files and report on stderr.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <unistd.h>

#include "gguf/gguf.h"
#include "test_util.h"

namespace smolrt {
namespace {

namespace fs = std::filesystem;

// `smolrt args` through the shell; out holds stdout and stderr together.
test::Proc run_smolrt(const std::string& args) {
  return test::run_shell(cat("'", SMOLRT_BINARY, "' ", args, " 2>&1"));
}

class CliQuant : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("smolrt_cli_quant_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string tmp(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(CliQuant, UnknownTypeIsAClearError) {
  REQUIRE_FIXTURE(path, "models/stories260K.gguf");
  const test::Proc r =
      run_smolrt("quantize '" + path.string() + "' '" + tmp("o.gguf") + "' --type q5_k");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("unknown type 'q5_k' for --type"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(tmp("o.gguf")));
}

TEST_F(CliQuant, MissingInputAndMissingFlag) {
  test::Proc r = run_smolrt("quantize /nonexistent/in.gguf '" + tmp("o.gguf") + "' --type q8_0");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("/nonexistent/in.gguf' does not exist"), std::string::npos) << r.out;
  r = run_smolrt("quantize a.gguf b.gguf");  // --type is required
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("--type"), std::string::npos) << r.out;
  r = run_smolrt("quantize a.gguf b.gguf --type q4_0 --bogus");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("--bogus"), std::string::npos) << r.out;
}

TEST_F(CliQuant, NotAGgufIsAClearError) {
  {
    FILE* f = std::fopen(tmp("junk.gguf").c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fputs("this is not a gguf file at all", f);
    std::fclose(f);
  }
  const test::Proc r =
      run_smolrt("quantize '" + tmp("junk.gguf") + "' '" + tmp("o.gguf") + "' --type q8_0");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("smolrt quantize: error:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("junk.gguf"), std::string::npos) << r.out;
}

TEST_F(CliQuant, StoriesToQ4_0ReportsTheF16Fallback) {
  REQUIRE_FIXTURE(path, "models/stories260K.gguf");
  const test::Proc r =
      run_smolrt("quantize '" + path.string() + "' '" + tmp("q.gguf") + "' --type q4_0");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("blk.0.ffn_down.weight: row length 172"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("quantize: wrote"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[ 1/48]"), std::string::npos) << r.out;  // progress lines
  auto f = gguf::File::open(tmp("q.gguf"));
  EXPECT_EQ(f->get_uint("general.file_type"), 2u);
  EXPECT_EQ(f->find_tensor("blk.0.attn_q.weight")->type, GgmlType::Q4_0);
  EXPECT_EQ(f->find_tensor("blk.0.ffn_down.weight")->type, GgmlType::F16);
}

TEST_F(CliQuant, SynthThenQuantize) {
  test::Proc r = run_smolrt("synth --preset tiny --seed 3 -o '" + tmp("t.gguf") + "'");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("synth: wrote"), std::string::npos) << r.out;
  r = run_smolrt("synth --preset tiny --seed 3 --type f32 -o '" + tmp("t32.gguf") + "'");
  ASSERT_EQ(r.rc, 0) << r.out;
  r = run_smolrt("quantize '" + tmp("t32.gguf") + "' '" + tmp("t8.gguf") + "' --type q8_0 -q");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out.find("[ 1/"), std::string::npos) << "--quiet still printed progress";
  auto f = gguf::File::open(tmp("t8.gguf"));
  EXPECT_EQ(f->get_uint("general.file_type"), 7u);
  EXPECT_EQ(f->find_tensor("blk.1.ffn_up.weight")->type, GgmlType::Q8_0);
  EXPECT_EQ(f->find_tensor("blk.1.ffn_norm.weight")->type, GgmlType::F32);
}

TEST_F(CliQuant, SynthBadFlags) {
  test::Proc r = run_smolrt("synth --preset llama-70b -o '" + tmp("x.gguf") + "'");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("unknown preset 'llama-70b'"), std::string::npos) << r.out;
  r = run_smolrt("synth --preset tiny --type q3_k -o '" + tmp("x.gguf") + "'");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("q3_k"), std::string::npos) << r.out;
  r = run_smolrt("synth --preset tiny");  // -o is required
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("--output"), std::string::npos) << r.out;
  r = run_smolrt("synth --preset tiny --seed banana -o '" + tmp("x.gguf") + "'");
  EXPECT_NE(r.rc, 0);
  EXPECT_FALSE(fs::exists(tmp("x.gguf")));
}

// gguf-py (ggml's Python package) as an independent oracle: every q4_0 / q4_1 / q8_0 / f16 tensor
// that `smolrt quantize` writes must be byte-identical to gguf.quants.quantize() of the source.
// Skips visibly when the package is missing (scripts/test-requirements.txt installs it).
TEST(QuantOracle, ByteExactAgainstGgufPy) {
  const char* py = std::getenv("SMOLRT_PYTHON");
  const std::string script = std::string(SMOLRT_SOURCE_DIR) + "/tests/oracle/gguf_quant_oracle.py";
  const std::string cmd = std::string(py ? py : "python3") + " '" + script + "' --smolrt '" +
                          SMOLRT_BINARY + "' --fixtures '" + fixtures_dir().string() + "' 2>&1";
  const test::Proc r = test::run_shell(cmd);
  const std::string& out = r.out;
  const int code = r.rc;
  if (code == 77) GTEST_SKIP() << "skipped: " << out;
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("0 mismatched"), std::string::npos) << out;
  std::printf("%s", out.c_str());
}

}  // namespace
}  // namespace smolrt
