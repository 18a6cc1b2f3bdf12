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
      run_smolrt("quantize '" + path.string() + "' '" + tmp("o.gguf") + "' --type q3_k");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("unknown type 'q3_k' for --type; use one of"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("q4_k_m"), std::string::npos) << r.out;
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
      run_smolrt("quantize '" + path.string() + "' '" + tmp("q.gguf") + "' --type q4_0 -v");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("blk.0.ffn_down.weight: row length 172"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("quantize: wrote"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[ 1/48]"), std::string::npos) << r.out;  // progress lines with -v
  // Without -v: the summary alone, one line for the fallbacks.
  const test::Proc quiet =
      run_smolrt("quantize '" + path.string() + "' '" + tmp("q2.gguf") + "' --type q4_0");
  ASSERT_EQ(quiet.rc, 0) << quiet.out;
  EXPECT_EQ(quiet.out.find("[ 1/48]"), std::string::npos) << quiet.out;
  EXPECT_EQ(quiet.out.find("row length 172"), std::string::npos) << quiet.out;
  EXPECT_NE(quiet.out.find("quantize: 5 tensor(s) kept another type, their row length not a "
                           "multiple of the target's block: 5 as f16 (-v lists them)"),
            std::string::npos)
      << quiet.out;
  auto f = gguf::File::open(tmp("q.gguf"));
  EXPECT_EQ(f->get_uint("general.file_type"), 2u);
  EXPECT_EQ(f->find_tensor("blk.0.attn_q.weight")->type, GgmlType::Q4_0);
  EXPECT_EQ(f->find_tensor("blk.0.ffn_down.weight")->type, GgmlType::F16);
}

TEST_F(CliQuant, StoriesToQ4_K_MReportsWhatWentWhere) {
  // stories260K (dim 64, ffn 172): Q4_K falls back to Q5_0, the use_more_bits attn_v (layers 2
  // and 4) Q6_K -> Q8_0, ffn_down (172 columns) to F16; the summary counts the stored types.
  REQUIRE_FIXTURE(path, "models/stories260K.gguf");
  const test::Proc r =
      run_smolrt("quantize '" + path.string() + "' '" + tmp("q.gguf") + "' --type Q4_K_M -v");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("note: blk.0.attn_q.weight: row length 64 is not a multiple of 256, so it "
                       "cannot be stored as q4_k; storing it as q5_0 instead"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("blk.2.attn_v.weight: row length 64 is not a multiple of 256, so it cannot "
                       "be stored as q6_k; storing it as q8_0 instead"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("blk.0.ffn_down.weight: row length 172 is not a multiple of 256, so it "
                       "cannot be stored as q4_k; storing it as f16 instead"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("blk.2.attn_v.weight          f32   -> q8_0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("quantize: 36 tensor(s) kept another type, their row length not a multiple "
                       "of the target's block: 5 as f16, 29 as q5_0, 2 as q8_0\n"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("quantize: stored types: 11 f32, 5 f16, 29 q5_0, 3 q8_0"), std::string::npos)
      << r.out;
  auto f = gguf::File::open(tmp("q.gguf"));
  EXPECT_EQ(f->get_uint("general.file_type"), 15u);
  EXPECT_EQ(f->find_tensor("blk.4.attn_v.weight")->type, GgmlType::Q8_0);
  EXPECT_EQ(f->find_tensor("blk.3.attn_v.weight")->type, GgmlType::Q5_0);
  EXPECT_EQ(f->find_tensor("blk.0.ffn_down.weight")->type, GgmlType::F16);
  // The CPU backend runs it end to end.
  const test::Proc g = run_smolrt("run -m '" + tmp("q.gguf") +
                                  "' -p 'Once upon a time' -n 8 --backend cpu --temp 0");
  EXPECT_EQ(g.rc, 0) << g.out;
}

TEST_F(CliQuant, EveryNewTypeRoundTripsThroughTheCli) {
  // synth f32 -> quantize to each new target -> quantize back to f32 from it (a K / Q5 source).
  ASSERT_EQ(run_smolrt("synth --preset tiny --type f32 -o '" + tmp("t32.gguf") + "'").rc, 0);
  for (const char* t : {"q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "q4_k_s", "q5_k_s", "q5_k_m"}) {
    const std::string out = tmp(std::string(t) + ".gguf");
    test::Proc r =
        run_smolrt("quantize '" + tmp("t32.gguf") + "' '" + out + "' --type " + t + " -q");
    ASSERT_EQ(r.rc, 0) << t << "\n" << r.out;
    EXPECT_NE(r.out.find(std::string("type ") + t), std::string::npos) << r.out;
    r = run_smolrt("quantize '" + out + "' '" + tmp("back.gguf") + "' --type f32 -q");
    ASSERT_EQ(r.rc, 0) << t << "\n" << r.out;
  }
  // synth writes the mixtures and new types directly.
  const test::Proc r =
      run_smolrt("synth --preset tiny --type q5_k_m --seed 4 -o '" + tmp("s.gguf") + "'");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("type q5_k_m"), std::string::npos) << r.out;
  auto f = gguf::File::open(tmp("s.gguf"));
  EXPECT_EQ(f->get_uint("general.file_type"), 17u);
  EXPECT_EQ(f->find_tensor("blk.0.ffn_up.weight")->type, GgmlType::Q5_1);  // 64 cols: fall-back
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
