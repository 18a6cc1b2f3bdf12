// `smolrt bench` end to end on the CPU backend (stories260K): JSON lines with the record fields,
// statistics that hold together, and bad flags rejected with a message naming the flag.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/bench.h"
#include "test_util.h"

namespace smolrt {
namespace {

TEST(BenchCli, JsonLinesOnStories260K) {
  REQUIRE_FIXTURE(model, "models/stories260K.gguf");
  const test::Proc p = test::run_smolrt({"bench", "-m", model.string(), "--backend", "cpu",
                                         "--prompt-lengths", "8,24", "--gen-length", "6",
                                         "--iterations", "2", "--threads", "2", "--json"});
  ASSERT_EQ(p.rc, 0) << p.err;
  std::istringstream lines(p.out);
  std::string line;
  std::vector<int> lengths;
  while (std::getline(lines, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    lengths.push_back(j["prompt_length"].get<int>());
    EXPECT_EQ(j["backend"], "cpu");
    EXPECT_EQ(j["gen_length"], 6);
    EXPECT_EQ(j["iterations"], 2);
    EXPECT_EQ(j["model"], "stories260K.gguf");
    EXPECT_FALSE(j["gpu"].get<std::string>().empty());
    EXPECT_FALSE(j["commit"].get<std::string>().empty());
    EXPECT_EQ(j["date"].get<std::string>().size(), 20u);  // 2026-11-21T14:07:43Z
    for (const char* k : {"prefill_tok_s", "decode_tok_s", "ttft_ms", "decode_us_per_token"}) {
      const double lo = j[k]["min"], med = j[k]["median"], hi = j[k]["max"];
      EXPECT_GT(lo, 0) << k;
      EXPECT_LE(lo, med) << k;
      EXPECT_LE(med, hi) << k;
    }
    // decode_weight_bytes: every layer tensor + output norm + output (tied: token_embd) + a row.
    EXPECT_GT(j["decode_weight_bytes"].get<double>(), 1e6);
  }
  EXPECT_EQ(lengths, (std::vector<int>{8, 24}));
}

// bench-batch --chunks: each decode step also carries new prompts behind the cached shared
// prefix; the record says how much of them the cache held (the prefix's whole pages).
TEST(BenchCli, BatchChunksBesideDecodesHitTheCache) {
  REQUIRE_FIXTURE(model, "models/stories260K.gguf");
  const std::string json = ::testing::TempDir() + "bench_batch_chunks.jsonl";
  std::remove(json.c_str());
  const test::Proc p =
      test::run_smolrt({"bench-batch", "-m", model.string(), "--backend", "cpu", "--sizes", "3",
                        "--prompt", "72", "--shared-prefix", "36", "--gen", "5", "--chunks", "2",
                        "--page-size", "16", "--json", json});
  ASSERT_EQ(p.rc, 0) << p.err;
  std::ifstream f(json);
  std::string line;
  ASSERT_TRUE(std::getline(f, line));
  const nlohmann::json j = nlohmann::json::parse(line);
  EXPECT_EQ(j["chunks"], 2);
  // Two whole pages of the 36 shared tokens, and none of an arrival's own pages (32-47 and 48-63
  // hold its own tokens): its prompt is new to the cache, as a served request's would be.
  EXPECT_EQ(j["chunk_cached_tokens"].get<double>(), 32.0);
  EXPECT_GT(j["decode_tok_s"].get<double>(), 0.0);
  const test::Proc q = test::run_smolrt(
      {"bench-batch", "-m", model.string(), "--backend", "cpu", "--prompt", "40", "--chunks", "1"});
  EXPECT_NE(q.rc, 0);
  EXPECT_NE(q.err.find("--chunks needs --shared-prefix"), std::string::npos) << q.err;
}

TEST(BenchCli, BadFlagsNameTheFlag) {
  const test::Proc a = test::run_smolrt({"bench", "--iterations", "0"});
  EXPECT_NE(a.rc, 0);
  EXPECT_NE((a.out + a.err).find("--iterations"), std::string::npos) << a.out << a.err;
  const test::Proc b = test::run_smolrt({"bench", "--prompt-lengths", "32,-5"});
  EXPECT_NE(b.rc, 0);
  EXPECT_NE((b.out + b.err).find("--prompt-lengths"), std::string::npos) << b.out << b.err;
  const test::Proc c = test::run_smolrt({"bench", "--backend", "tpu"});
  EXPECT_NE(c.rc, 0);
  EXPECT_NE((c.out + c.err).find("--backend"), std::string::npos) << c.out << c.err;
}

TEST(BenchCli, PromptTooLongForContextIsAnError) {
  REQUIRE_FIXTURE(model, "models/stories260K.gguf");
  const test::Proc p =
      test::run_smolrt({"bench", "-m", model.string(), "--backend", "cpu", "--ctx", "64",
                        "--prompt-lengths", "60", "--gen-length", "8", "--iterations", "1"});
  EXPECT_EQ(p.rc, 1);
  EXPECT_NE(p.err.find("exceeds the context of 64"), std::string::npos) << p.err;
}

TEST(Bench, StatOfGivesMedianMinMax) {
  const Stat odd = stat_of({3, 1, 2});
  EXPECT_EQ(odd.median, 2);
  EXPECT_EQ(odd.min, 1);
  EXPECT_EQ(odd.max, 3);
  const Stat even = stat_of({4, 1, 3, 2});
  EXPECT_EQ(even.median, 2.5);
  const Stat none = stat_of({});
  EXPECT_EQ(none.median, 0);
}

TEST(Bench, PromptIsDeterministicAndInRange) {
  const std::vector<int> a = bench_prompt(500, 512), b = bench_prompt(500, 512);
  EXPECT_EQ(a, b);
  int distinct = 0;
  std::vector<bool> seen(512);
  for (int id : a) {
    ASSERT_GE(id, 0);
    ASSERT_LT(id, 512);
    distinct += !seen[id];
    seen[id] = true;
  }
  EXPECT_GT(distinct, 200);  // not a constant or a short cycle
}

}  // namespace
}  // namespace smolrt
